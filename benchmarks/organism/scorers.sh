#!/usr/bin/env bash
# The organism's head rankings by every scorer of `rank --score` (issue 40): ram, retrieval, outside-window
# (S = 4, W = 16, as the hybrid table) and causal (exact single-head log-p drop, zero), each task ranked on
# rank200.sh's 200 seed-1 samples (made here when missing), with the query rows the result tables use: answer
# rows for image and video, question rows for documents (retrieval and causal always read the teacher-forced
# answer). P(top-k) for k = 1, 2, 3, 5, 8, 16. Writes $OUT/score-<scorer>-<task>/ (OUT default runs/organism).
# N ranks the first N samples only (default 200: try N=8 OUT=/tmp/x first); SCORES and TASKS pick a subset;
# PYTHON the interpreter (default .venv/bin/python). Runs resume where they stopped.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/organism}
N=${N:-200}
SCORES=${SCORES:-ram retrieval outside-window causal}
TASKS=${TASKS:-image video document}
query() { [ "$1" = document ] && echo question || echo answer; }
extra() { [ "$1" = outside-window ] && echo "--sink 4 --window 16" || true; }
mkdir -p "$OUT"
for task in $TASKS; do
  data=$OUT/rank-data/$task.jsonl
  [ -f "$data" ] || $PY -c "from corelens.organism.tasks import generate; generate('$task', '$OUT/rank-data', 200, seed=1)"
  for score in $SCORES; do
    # shellcheck disable=SC2046
    $PY -m corelens rank --model src/corelens/organism/checkpoint --data "$data" --limit "$N" \
      --query $(query $task) --score $score $(extra $score) --k 1,2,3,5,8,16 --overlays 0 \
      --out "$OUT/score-$score-$task"
  done
done
