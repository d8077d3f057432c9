#!/usr/bin/env bash
# The optimised head scores of issue 40 on the organism: DuoAttention's gates (`--score gates`) and the greedy
# joint selection (`--score greedy`, hybrid mode, 8 heads) on each task's 200 seed-1 rank samples
# (rank200.sh's rank-data; generated here when missing), with the streaming budget of hybrid.sh (S = 4,
# W = 16). Gates: one gate per query head, the hidden-state loss, 2 epochs of 4-sample steps. Each run's
# manifest.json records its wall time ("timings"), printed at the end.
# Results: runs/organism/score-gates-<task>/ (heads.csv, gates.csv, gate_losses.csv, figures/gate_loss.png)
# and runs/organism/score-greedy-<task>/ (heads.csv, greedy.csv). LIMIT=N uses the first N samples (a
# quick check); OUT and CORELENS move the output folder and the corelens command.
set -euo pipefail
OUT=${OUT:-runs/organism}
CL=${CORELENS:-.venv/bin/corelens}
PY=${PYTHON:-.venv/bin/python}
M=src/corelens/organism/checkpoint
extra=()
if [ -n "${LIMIT:-}" ]; then extra=(--limit "$LIMIT"); fi
common=(--model $M --sink 4 --window 16 --k 1,2,3,5,8,16 --overlays 0 "${extra[@]}")
for task in ${TASKS:-image video document}; do
  data=$OUT/rank-data/$task.jsonl
  if [ ! -f "$data" ]; then
    "$PY" -c "from corelens.organism.tasks import generate; generate('$task', '$OUT/rank-data', 200, seed=1)"
  fi
  "$CL" rank "${common[@]}" --data "$data" --score gates --gate-epochs 2 --gate-batch 4 --out "$OUT/score-gates-$task"
  "$CL" rank "${common[@]}" --data "$data" --score greedy --greedy-budget 8 --out "$OUT/score-greedy-$task"
done
"$PY" - "$OUT" <<'PY'
import json
import sys
from pathlib import Path

for run in sorted(Path(sys.argv[1]).glob("score-g*-*/manifest.json")):
    manifest = json.loads(run.read_text())
    print(f"{run.parent.name}: {manifest.get('timings')} s, {manifest.get('samples')} samples")
PY
