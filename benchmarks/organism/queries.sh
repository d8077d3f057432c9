#!/usr/bin/env bash
# Which RAM query rows find the organism's causal heads? For each task: rank the heads on 24 seed-1
# samples with each query set (question, last, answer), then zero the top-k / random-k heads (k = 1, 3, 5;
# 2 random draws) on 40 seed-3 samples. Writes results/queries.csv (one row per task, query, set, k).
set -euo pipefail
OUT=runs/queries
mkdir -p "$OUT"
for task in image video document; do
  .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$task', '$OUT/rank-data', 24, seed=1); generate('$task', '$OUT/eval-data', 40, seed=3)"
  for q in question answer last; do
    .venv/bin/corelens rank --model src/corelens/organism/checkpoint --data "$OUT/rank-data/$task.jsonl" --query $q --out "$OUT/rank-$task-$q"
    .venv/bin/corelens ablate --model src/corelens/organism/checkpoint --data "$OUT/eval-data/$task.jsonl" --heads "$OUT/rank-$task-$q/heads.csv" \
      --k 1,3,5 --sets top,random --seeds 2 --op zero --out "$OUT/ablate-$task-$q"
  done
done
.venv/bin/python - "$OUT" <<'PY'
import sys
from pathlib import Path

import pandas as pd

out = Path(sys.argv[1])
rows = []
for task in ("image", "video", "document"):
    for q in ("question", "answer", "last"):
        heads = pd.read_csv(out / f"rank-{task}-{q}" / "heads.csv").head(5)
        table = pd.read_csv(out / f"ablate-{task}-{q}" / "ablation.csv")
        for (kind, k), acc in table[table.set != "none"].groupby(["set", "k"]).accuracy.mean().items():
            rows.append({"task": task, "query": q, "set": kind, "k": k, "accuracy": acc,
                         "top5": " ".join(f"L{r.layer}H{r.head}" for r in heads.itertuples()),
                         "top1_mass": heads.mass.iloc[0]})
pd.DataFrame(rows).to_csv("benchmarks/organism/results/queries.csv", index=False)
print(pd.DataFrame(rows).pivot_table(index=["task", "query"], columns=["set", "k"], values="accuracy").round(2))
PY
