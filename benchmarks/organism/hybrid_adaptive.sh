#!/usr/bin/env bash
# Adaptive vs fixed CoRe hybrid attention on the organism's documents at equal budgets (issue 21): accuracy,
# set overlap and the selection's cost in attention scores (no timing: see hybrid_adaptive.py).
set -euo pipefail
mkdir -p runs/organism
.venv/bin/python benchmarks/organism/hybrid_adaptive.py runs/organism
cp runs/organism/hybrid-adaptive-document.csv benchmarks/organism/results/
