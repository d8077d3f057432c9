#!/usr/bin/env bash
# Organism attention priors (issues 6 and 17): the SAP sweep (four priors, in the late third and in all
# layers) on 60 seed-3 samples per task, at two strengths of the key and complexity priors:
# --prior-temperature 1 (softmax of values in [0, 1]: near uniform) and 0.1 (sharp).
set -euo pipefail
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', 'runs/sap-data', 60, seed=3)"
  for t in 1 0.1; do
    .venv/bin/corelens sap --model src/corelens/organism/checkpoint --data runs/sap-data/$task.jsonl \
      --layers late --layers all --prior-temperature $t --out runs/sap-$task-T$t
    for part in accuracy key_region priors; do
      cp runs/sap-$task-T$t/$part.csv benchmarks/organism/results/sap-$task-T$t-$part.csv
    done
  done
done
