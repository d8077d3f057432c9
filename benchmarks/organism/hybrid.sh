#!/usr/bin/env bash
# Organism hybrid-attention accuracy (issue 5) on 60 seed-3 documents (4-12 pages, about 60-170 tokens),
# with the CoRe heads ranked two ways on 24 seed-1 documents (`queries.sh`; run it first): on the answer
# rows and on the question rows. The window is scaled to the
# prompt: S = 4 sink tokens, W = 16 recent keys, so a streaming head sees about a page and a half. Random
# sets are drawn from all heads; decoding after the hybrid prefill uses full attention (the paper), and a
# third run streams in decoding too.
set -euo pipefail
.venv/bin/python -c "from corelens.organism.tasks import generate; generate('document', 'runs/hybrid-data', 60, seed=3)"
for rows in answer question; do
  heads=runs/queries/rank-document-$rows/heads.csv
  .venv/bin/corelens hybrid --model src/corelens/organism/checkpoint --data runs/hybrid-data/document.jsonl \
    --heads "$heads" --keep 1,2,3,5,8,16 --sets top,random,bottom --seeds 5 \
    --sink 4 --window 16 --out "runs/hybrid-document-$rows"
  cp "runs/hybrid-document-$rows/hybrid.csv" "benchmarks/organism/results/hybrid-document-$rows.csv"
done
# The same question-row policies with streamed decoding (the default above decodes with full attention).
.venv/bin/corelens hybrid --model src/corelens/organism/checkpoint --data runs/hybrid-data/document.jsonl \
  --heads runs/queries/rank-document-question/heads.csv --keep 1,2,3,5,8,16 --sets top,random,bottom --seeds 5 \
  --sink 4 --window 16 --decode stream --out runs/hybrid-document-question-stream
cp runs/hybrid-document-question-stream/hybrid.csv benchmarks/organism/results/hybrid-document-question-stream.csv
