#!/usr/bin/env bash
# Organism causal importance beside RAM (issue 33): the 200-sample rankings of rank200.sh (run it first;
# answer rows for image and video, question rows for documents, as the result tables rank each task), every
# head zeroed alone on the first EVAL_N of rank200.sh's 200 seed-3 evaluation samples (default 100; exact
# effect and attribution patching). Writes benchmarks/organism/results/importance-<task>.csv and .json and
# docs/figures/organism-video-importance.png, and prints the Spearman of RAM and causal importance. PYTHON picks the interpreter (default .venv/bin/python);
# TASKS="image video document" by default.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
OUT=runs/organism
EVAL_N=${EVAL_N:-100}
TASKS=${TASKS:-image video document}
query() { [ "$1" = document ] && echo question || echo answer; }
for task in $TASKS; do
  $PY -m corelens importance --model src/corelens/organism/checkpoint --data $OUT/eval-data/$task.jsonl \
    --limit "$EVAL_N" --heads $OUT/rank-$task-$(query $task)/heads.csv --op zero --method both \
    --out $OUT/importance-$task
  cp $OUT/importance-$task/importance.csv benchmarks/organism/results/importance-$task.csv
  cp $OUT/importance-$task/summary.json benchmarks/organism/results/importance-$task.json
  if [ "$task" = video ]; then cp $OUT/importance-$task/figures/ram_vs_causal.png docs/figures/organism-video-importance.png; fi
done
