#!/usr/bin/env bash
# Which RAM query rows find the organism's causal heads? For each task and query set (question, answer,
# last), the heads ranked on 200 seed-1 samples (rank200.sh) and the top-3 / top-5 zeroed on 200 seed-3
# samples; the controls are ablate.sh's. The default query of each task (answer rows for image and video,
# question rows for documents) is ablate.sh's top-k run on the same ranking and data: its k = 3 / 5 rows are
# read from runs/organism/ablate-<task>-top, or from results/ablate-<task>.csv when that run is gone.
# Writes results/queries.csv (one row per task, query, k) with the Wilson interval of each cell.
set -euo pipefail
OUT=runs/organism
for task in image video document; do
  for q in question answer last; do
    if [ "$q" = "$([ $task = document ] && echo question || echo answer)" ]; then
      # ablate.sh's top-k run on the same ranking: its run, or the table it left in results/
      [ -f "$OUT/ablate-$task-top/ablation.csv" ] && ln -sfn "ablate-$task-top" "$OUT/queries-$task-$q"
      continue
    fi
    .venv/bin/corelens ablate --model src/corelens/organism/checkpoint --data "$OUT/eval-data/$task.jsonl" \
      --heads "$OUT/rank-$task-$q/heads.csv" --k 3,5 --sets top --op zero --out "$OUT/queries-$task-$q"
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
        heads = pd.read_csv(out / f"rank-{task}-{q}" / "heads.csv").sort_values("rank").head(5)
        run = out / f"queries-{task}-{q}" / "ablation.csv"
        table = pd.read_csv(run if run.is_file() else f"benchmarks/organism/results/ablate-{task}.csv")
        table = table.query("set == 'top' and k in (3, 5)")
        for r in table.itertuples():
            rows.append({"task": task, "query": q, "set": "top", "k": r.k, "accuracy": r.accuracy, "n": r.n,
                         "ci_low": r.ci_low, "ci_high": r.ci_high, "heads": r.heads,
                         "top5": " ".join(f"L{h.layer}H{h.head}" for h in heads.itertuples()),
                         "top1_mass": heads.mass.iloc[0]})
pd.DataFrame(rows).to_csv("benchmarks/organism/results/queries.csv", index=False)
print(pd.DataFrame(rows).pivot_table(index=["task", "query"], columns="k", values="accuracy").round(3))
PY
