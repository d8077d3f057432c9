#!/usr/bin/env bash
# Organism residual geometry and attention priors (issue 6): Table-1 analogue on 20 seed-3 samples per
# task (all three baselines), then the SAP sweep (four priors, late and all layers) on 60 per task.
set -euo pipefail
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', 'runs/flow-data', 60, seed=3)"
  .venv/bin/corelens flow --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
    --limit 20 --out runs/flow-$task
  .venv/bin/corelens sap --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
    --layers late --layers all --out runs/sap-$task
  cp runs/flow-$task/table1.csv benchmarks/organism/results/flow-$task-table1.csv
  for part in accuracy key_region; do
    cp runs/sap-$task/$part.csv benchmarks/organism/results/sap-$task-$part.csv
  done
done
