#!/usr/bin/env bash
# The optimised head scores of issue 40 on the organism: DuoAttention's gates (`--score gates`) and the greedy
# joint selection (`--score greedy`, hybrid mode, 8 heads) on each task's 200 seed-1 rank samples
# (rank200.sh's rank-data; generated here when missing), with the streaming budget of hybrid.sh (S = 4,
# W = 16). Gates: one gate per query head, the hidden-state loss, 2 epochs of 4-sample steps. Each run's
# manifest.json records its wall time ("timings"), printed at the end.
# Results: runs/organism/score-gates-<task>/ (heads.csv, gates.csv, gate_losses.csv, figures/gate_loss.png)
# and runs/organism/score-greedy-<task>/ (heads.csv, greedy.csv), copied to results/gates-<task>.csv,
# gate-losses-<task>.csv and greedy-<task>.csv; each run's wall time to results/gates-timing.csv.
# GREEDY_LIMIT=N runs greedy on the first N samples (docs/results.md's rankings: 48, about 2 min a task here).
# LIMIT=N uses the first N samples (a quick check: nothing is copied to results/); OUT, CORELENS and PYTHON
# move the output folder, the corelens command and the interpreter.
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
  greedy=()
  if [ -n "${GREEDY_LIMIT:-}" ] && [ -z "${LIMIT:-}" ]; then greedy=(--limit "$GREEDY_LIMIT"); fi
  "$CL" rank "${common[@]}" "${greedy[@]}" --data "$data" --score greedy --greedy-budget 8 --out "$OUT/score-greedy-$task"
done
"$PY" - "$OUT" "${LIMIT:-}" <<'PY'
import json
import shutil
import sys
from pathlib import Path

import pandas as pd

out, limit = Path(sys.argv[1]), sys.argv[2]
results = Path("benchmarks/organism/results")
rows = []
for manifest_path in sorted(out.glob("score-g*-*/manifest.json")):
    run = manifest_path.parent
    manifest = json.loads(manifest_path.read_text())
    scorer, task = run.name.removeprefix("score-").split("-", 1)
    rows.append({"scorer": scorer, "task": task, "seconds": manifest["timings"][-1], "resumed": manifest["resumed"]})
    print(f"{run.name}: {manifest['timings']} s")
    if not limit:
        for name, to in [("gates.csv", f"gates-{task}.csv"), ("gate_losses.csv", f"gate-losses-{task}.csv"),
                         ("greedy.csv", f"greedy-{task}.csv")]:
            if (run / name).is_file():
                shutil.copy(run / name, results / to)
if not limit:
    pd.DataFrame(rows).to_csv(results / "gates-timing.csv", index=False)
PY
