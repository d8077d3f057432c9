#!/usr/bin/env bash
# Organism residual geometry (issue 6): Table-1 analogue on 20 seed-3 samples per task (all three
# baselines). The SAP sweep is in sap.sh.
set -euo pipefail
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', 'runs/flow-data', 60, seed=3)"
  .venv/bin/corelens flow --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
    --limit 20 --out runs/flow-$task
  cp runs/flow-$task/table1.csv benchmarks/organism/results/flow-$task-table1.csv
done
