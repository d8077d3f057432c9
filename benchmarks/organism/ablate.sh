#!/usr/bin/env bash
# Organism ablation sweep (issues 4, 33): heads ranked on 200 seed-1 samples per task (rank200.sh; answer
# rows for image and video, question rows for documents), zeroed on 200 seed-3 samples per task.
# Top-k at k = 1, 2, 3, 5 and bottom-k at k = 5; the random (from all 32 heads) and layer-matched controls
# at k = 5, drawn per task (--seeds auto) until the mean over draws is known to 0.10 (95 %) or 10 draws
# (the budget of one shared 2-core machine: every cell answers 200 questions).
# PARTS: fixed (top-k) and/or controls (bottom, random, layer-matched; default both).
# Results: results/ablate-<task>.csv (one row per set and draw) and -summary.csv (per set and k: mean
# over draws, two-level interval over draws and questions, draws, width reached).
set -euo pipefail
PARTS=${*:-fixed controls}
OUT=runs/organism
RES=benchmarks/organism/results
query() { [ "$1" = document ] && echo question || echo answer; }
want() { [[ " $PARTS " == *" $1 "* ]]; }
ablate() {  # ablate TASK PART ARGS...
  local task=$1 part=$2; shift 2
  .venv/bin/corelens ablate --model src/corelens/organism/checkpoint --data $OUT/eval-data/$task.jsonl \
    --heads $OUT/rank-$task-$(query $task)/heads.csv --op zero "$@" --out $OUT/ablate-$task-$part
}
if want fixed; then
  for task in document image video; do
    ablate $task top --k 1,2,3,5 --sets top
  done
fi
if want controls; then
  for task in document image video; do
    ablate $task controls --k 5 --sets bottom,random,layer-matched --seeds auto --control-width 0.10 --max-draws 10
  done
fi
for task in image video document; do
  [ -f $OUT/ablate-$task-controls/ablation.csv ] || continue
  .venv/bin/python - "$OUT" "$task" "$RES" <<'PY'
import sys
from pathlib import Path

import pandas as pd

out, task, res = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
runs = [out / f"ablate-{task}-{part}" for part in ("top", "controls")]
table = pd.concat([pd.read_csv(r / "ablation.csv").query("set != 'none'" if i else "set == set") for i, r in enumerate(runs)])
table.to_csv(res / f"ablate-{task}.csv", index=False)
summary = pd.concat([pd.read_csv(r / "ablation_summary.csv").query("set != 'none'" if i else "set == set")
                     for i, r in enumerate(runs)])
summary.to_csv(res / f"ablate-{task}-summary.csv", index=False)
print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
PY
done
