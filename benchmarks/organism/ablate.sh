#!/usr/bin/env bash
# Organism ablation sweep (issue 4): heads ranked by `make demo` (8 seed-1 samples per task), evaluated on seed 3.
set -euo pipefail
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', 'runs/ablate-data', 40, seed=3)"
  .venv/bin/corelens ablate --model src/corelens/organism/checkpoint --data runs/ablate-data/$task.jsonl \
    --heads runs/demo/rank-$task/heads.csv --k 1,2,3,5 --sets top,bottom,random,layer-matched --seeds 5 \
    --op zero --out runs/ablate-$task
  cp runs/ablate-$task/ablation.csv benchmarks/organism/results/ablate-$task.csv
done
