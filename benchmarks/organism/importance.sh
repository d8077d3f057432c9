#!/usr/bin/env bash
# Organism causal importance beside RAM (issue 33): heads ranked on 24 seed-1 samples per task, every head
# zeroed alone on 20 seed-3 samples (exact effect and attribution patching). Writes
# benchmarks/organism/results/importance-<task>.csv and prints the Spearman of RAM and causal importance.
# PYTHON picks the interpreter (default .venv/bin/python).
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
RANK_N=${RANK_N:-24}
EVAL_N=${EVAL_N:-20}
declare -A QUERY=([image]=answer [video]=answer [document]=question)  # as the demo ranks each task
for task in image video document; do
  $PY -c "from corelens.organism.tasks import generate; generate('$task', 'runs/importance-rank-data', $RANK_N, seed=1)"
  $PY -c "from corelens.organism.tasks import generate; generate('$task', 'runs/importance-data', $EVAL_N, seed=3)"
  $PY -m corelens rank --model src/corelens/organism/checkpoint --data runs/importance-rank-data/$task.jsonl \
    --query "${QUERY[$task]}" --out runs/importance-rank-$task
  $PY -m corelens importance --model src/corelens/organism/checkpoint --data runs/importance-data/$task.jsonl \
    --heads runs/importance-rank-$task/heads.csv --op zero --method both --out runs/importance-$task
  cp runs/importance-$task/importance.csv benchmarks/organism/results/importance-$task.csv
  cp runs/importance-$task/summary.json benchmarks/organism/results/importance-$task.json
done
