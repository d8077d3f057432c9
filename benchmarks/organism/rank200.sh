#!/usr/bin/env bash
# The organism's rankings behind the result tables (issue 33): each task ranked on 200 seed-1 samples with
# each query set (question, answer, last prompt row), P(top-k) for k = 1, 2, 3, 5, 8, 16. ablate.sh,
# queries.sh, hybrid.sh and hybrid_adaptive.sh read these; 200 seed-3 samples per task are their
# evaluation data (the first 8 / 24 / 40 / 60 of each are the earlier scripts' samples). Run it first.
set -euo pipefail
OUT=runs/organism
mkdir -p "$OUT"
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', '$OUT/rank-data', 200, seed=1); generate('$task', '$OUT/eval-data', 200, seed=3)"
  for q in question answer last; do
    .venv/bin/corelens rank --model src/corelens/organism/checkpoint --data "$OUT/rank-data/$task.jsonl" --query $q \
      --k 1,2,3,5,8,16 --overlays 0 --out "$OUT/rank-$task-$q"
  done
done
