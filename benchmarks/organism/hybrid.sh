#!/usr/bin/env bash
# Organism hybrid-attention accuracy (issues 5, 33) on 200 seed-3 documents (4-12 pages, about 60-170
# tokens), with the CoRe heads ranked two ways on 200 seed-1 documents (rank200.sh; run it first): on the
# question rows and on the answer rows. The window is scaled to the prompt: S = 4 sink tokens, W = 16
# recent keys, so a streaming head sees about a page and a half. The question-row top set at 1, 3, 5, 8 and
# 16 full heads, the answer-row top set at 8; bottom and random sets (from all heads, drawn per task,
# --seeds auto up to 10 draws) at 8 (the budget of one shared 2-core machine: every cell answers 200
# documents). Decoding after the hybrid prefill uses full attention (the paper).
# Results: results/hybrid-document-<rows>.csv (one row per set and draw) and hybrid-document-summary.csv;
# docs/figures/organism-document-hybrid.png is drawn from results/hybrid-document-question.csv (part
# `figure`, run last by default: `hybrid.sh figure` redraws it from the table alone).
set -euo pipefail
OUT=runs/organism
M=src/corelens/organism/checkpoint
common=(--model $M --data $OUT/eval-data/document.jsonl --sink 4 --window 16)
PARTS=${*:-top controls answer figure}
want() { [[ " $PARTS " == *" $1 "* ]]; }
want top && .venv/bin/corelens hybrid "${common[@]}" --heads $OUT/rank-document-question/heads.csv \
  --keep 1,3,5,8,16 --sets top --out $OUT/hybrid-document-question
want controls && .venv/bin/corelens hybrid "${common[@]}" --heads $OUT/rank-document-question/heads.csv \
  --keep 8 --sets bottom,random --seeds auto --control-width 0.10 --max-draws 10 --out $OUT/hybrid-document-random
want answer && .venv/bin/corelens hybrid "${common[@]}" --heads $OUT/rank-document-answer/heads.csv \
  --keep 8 --sets top --out $OUT/hybrid-document-answer
if [ -f $OUT/hybrid-document-answer/hybrid.csv ] && [ -f $OUT/hybrid-document-random/hybrid.csv ]; then
.venv/bin/python - "$OUT" <<'PY'
import sys
from pathlib import Path

import pandas as pd

out, res = Path(sys.argv[1]), Path("benchmarks/organism/results")
question = pd.concat([pd.read_csv(out / "hybrid-document-question" / "hybrid.csv"),
                      pd.read_csv(out / "hybrid-document-random" / "hybrid.csv").query("set != 'dense'")])
question.to_csv(res / "hybrid-document-question.csv", index=False)
answer = pd.read_csv(out / "hybrid-document-answer" / "hybrid.csv")
answer.to_csv(res / "hybrid-document-answer.csv", index=False)
parts = [("question", "hybrid-document-question"), ("answer", "hybrid-document-answer"),
         ("question", "hybrid-document-random")]
summary = pd.concat([pd.read_csv(out / run / "hybrid_summary.csv").assign(ranked_on=rows) for rows, run in parts])
summary = summary[(summary["set"] != "dense") | (summary["ranked_on"] == "question")].drop_duplicates(["set", "keep", "ranked_on"])
summary.to_csv(res / "hybrid-document-summary.csv", index=False)
print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
PY
fi
if want figure; then
.venv/bin/python - <<'PY'
import pandas as pd

from corelens.report.curves import accuracy_vs_kept

table = pd.read_csv("benchmarks/organism/results/hybrid-document-question.csv")
n = int(table["n"].iloc[0])
accuracy_vs_kept(table, "docs/figures/organism-document-hybrid.png",
                 title=f"hybrid attention on {n} organism documents (S=4, W=16; ranked on 200)")
print("wrote docs/figures/organism-document-hybrid.png")
PY
fi
