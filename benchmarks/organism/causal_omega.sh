#!/usr/bin/env bash
# Causal Omega against the annotations (issue 21): region IoU / recall, ranking Spearman, top-k ablation.
set -euo pipefail
mkdir -p runs/causal-omega
.venv/bin/python benchmarks/organism/causal_omega.py runs/causal-omega
for name in regions spearman ablate; do
  cp runs/causal-omega/causal-omega-$name.csv benchmarks/organism/results/
done
