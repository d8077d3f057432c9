#!/usr/bin/env bash
# Organism residual geometry (issue 6): Table-1 analogue on 20 seed-3 samples per task (all three
# baselines; TME sharpening α = 16 and α = 1; ε_RoPE on Δ and on X + Δ). The SAP sweep is in sap.sh.
set -euo pipefail
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', 'runs/flow-data', 60, seed=3)"
  # Default TME sharpening (α = 16, results/tme-alpha.csv) and the unsharpened α = 1; ε_RoPE on Δ,
  # and once more on the residual states X + Δ (--rope-on residual).
  .venv/bin/corelens flow --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
    --limit 20 --out runs/flow-$task
  .venv/bin/corelens flow --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
    --limit 20 --alpha 1 --out runs/flow-$task-alpha1
  .venv/bin/corelens flow --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
    --limit 20 --baseline none --rope-on residual --out runs/flow-$task-rope-residual
  cp runs/flow-$task/table1.csv benchmarks/organism/results/flow-$task-table1.csv
  cp runs/flow-$task-alpha1/table1.csv benchmarks/organism/results/flow-$task-table1-alpha1.csv
  cp runs/flow-$task-rope-residual/table1.csv benchmarks/organism/results/flow-$task-table1-rope-residual.csv
done
