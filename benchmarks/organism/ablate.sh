#!/usr/bin/env bash
# Organism ablation sweep (issues 4, 33): heads ranked on 200 seed-1 samples per task (rank200.sh; answer
# rows for image and video, question rows for documents), zeroed on 200 seed-3 samples per task.
# Top-k at k = 1, 2, 3, 5; bottom, random (from all 32 heads) and layer-matched sets at k = 5, the seeded
# ones drawn per task (--seeds auto) until the mean over draws is known to 0.10 (95 %) or 10 draws (the
# budget of one shared 2-core machine: every cell answers 200 questions).
# Usage: ablate.sh [top] [controls] (default both); TASKS="image video document" by default.
# Results: results/ablate-<task>.csv (one row per set and draw) and -summary.csv (per set and k: mean
# over draws, two-level interval over draws and questions, draws, width reached).
set -euo pipefail
PARTS=${*:-top controls}
TASKS=${TASKS:-image video document}
OUT=runs/organism
RES=benchmarks/organism/results
query() { [ "$1" = document ] && echo question || echo answer; }
want() { [[ " $PARTS " == *" $1 "* ]]; }
for task in $TASKS; do
  common=(--model src/corelens/organism/checkpoint --data $OUT/eval-data/$task.jsonl
          --heads $OUT/rank-$task-$(query $task)/heads.csv --op zero)
  want top && .venv/bin/corelens ablate "${common[@]}" --k 1,2,3,5 --sets top --out $OUT/ablate-$task-top
  want controls && .venv/bin/corelens ablate "${common[@]}" --k 5 --sets bottom,random,layer-matched \
    --seeds auto --control-width 0.10 --max-draws 10 --out $OUT/ablate-$task-controls
  .venv/bin/python - "$OUT" "$task" "$RES" <<'PY'
import sys
from pathlib import Path

import pandas as pd

out, task, res = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
runs = [r for r in (out / f"ablate-{task}-top", out / f"ablate-{task}-controls") if (r / "ablation.csv").is_file()]
for name, suffix in (("ablation.csv", ""), ("ablation_summary.csv", "-summary")):
    frames = [pd.read_csv(r / name) for r in runs]
    # one baseline ("none") row: the first run's
    table = pd.concat([f if i == 0 else f[f["set"] != "none"] for i, f in enumerate(frames)])
    table.to_csv(res / f"ablate-{task}{suffix}.csv", index=False)
print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
PY
done
