#!/usr/bin/env bash
# Does any TME sharpening α give the paper's MixIG signs (attention +, FFN ≈ 0, noise Δ −, noise QKV −)?
# `corelens flow` on the 20 seed-3 samples per task of flow.sh at each α; writes results/mixig-alpha.csv
# (one row per task, α and Table-1 row: mean MixIG and its sd over samples).
set -euo pipefail
OUT=runs/mixig-alpha
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', 'runs/flow-data', 60, seed=3)"
  for alpha in 1 4 8 16 32 64; do
    .venv/bin/corelens flow --model src/corelens/organism/checkpoint --data runs/flow-data/$task.jsonl \
      --limit 20 --alpha $alpha --no-rope --out "$OUT/$task-$alpha" > /dev/null
  done
done
.venv/bin/python - "$OUT" <<'PY'
import sys
from pathlib import Path

import pandas as pd

parts = []
for path in sorted(Path(sys.argv[1]).glob("*/table1.csv")):
    task = path.parent.name.rsplit("-", 1)[0]
    t = pd.read_csv(path)
    t = t[t["row"] != "ε_RoPE"]
    parts.append(t.assign(task=task)[["task", "alpha", "row", "samples", "mixig", "mixig_sd", "paper_mixig"]])
table = pd.concat(parts).sort_values(["task", "alpha"], kind="stable")
table.to_csv("benchmarks/organism/results/mixig-alpha.csv", index=False, float_format="%.5f")
print(table.pivot_table(index=["task", "alpha"], columns="row", values="mixig", sort=False).to_string())
PY
