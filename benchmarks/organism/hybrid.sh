#!/usr/bin/env bash
# Organism hybrid-attention accuracy (issue 5): CoRe heads ranked by `make demo` on seed-1 documents,
# evaluated on 60 seed-3 documents (4-12 pages, about 60-170 tokens). The window is scaled to the prompt:
# S = 4 sink tokens, W = 16 recent keys, so a streaming head sees about a page and a half of the document.
set -euo pipefail
.venv/bin/python -c "from corelens.organism.tasks import generate; generate('document', 'runs/hybrid-data', 60, seed=3)"
.venv/bin/corelens hybrid --model src/corelens/organism/checkpoint --data runs/hybrid-data/document.jsonl \
  --heads runs/demo/rank-document/heads.csv --keep 1,2,3,5,8,16 --sets top,random,bottom --seeds 5 \
  --sink 4 --window 16 --out runs/hybrid-document
