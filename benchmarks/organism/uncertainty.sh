#!/usr/bin/env bash
# Ranking uncertainty on the organism (issue 22). Parts (all by default, or name some: curves ablate hybrid case):
#   curves  rank each task on 96 seed-21 samples (the demo's query rows) and write its stability curve
#           (top-1/3/5/8 Jaccard and Spearman of two disjoint n-sample rankings, n = 2..48);
#   ablate  ablate.sh's sweep (heads ranked on 8 seed-1 samples, zeroed on 40 seed-3 samples) with the top-k
#           of 20 bootstrap resamples of the ranking and the stable set (P(top-k) >= 0.9);
#   hybrid  hybrid.sh's question-row curve (24 seed-1 documents ranked, 60 seed-3 evaluated, S = 4, W = 16)
#           with the same resamples and stable set;
#   case    the issue's case: documents ranked on 24 seed-11 or 24 seed-1 samples, top-8 kept full
#           (S = 4, W = 16) on 40 seed-12 documents, each with 20 resamples; decoding full (the default)
#           and stream (the trimmed cache, the only mode when the issue was filed).
# The random controls are drawn per task (--seeds auto until the mean over draws is known to 0.10, at most
# 10 draws: auto draws 10 before its first check, so 10 is also the least); their -summary.csv gives the
# mean over draws with its two-level interval (issue 33).
# Results: results/uncertainty-*.csv (ablate.sh / hybrid.sh / queries.sh keep their own CSVs).
set -euo pipefail
OUT=runs/uncertainty
M=src/corelens/organism/checkpoint
RES=benchmarks/organism/results
PARTS=${*:-curves ablate hybrid case}
mkdir -p "$OUT"
gen() { .venv/bin/python -c "from corelens.organism.tasks import generate; generate('$1', '$2', $3, seed=$4)"; }
query() { [ "$1" = document ] && echo question || echo answer; }
want() { [[ " $PARTS " == *" $1 "* ]]; }

if want curves; then
  for task in image video document; do
    gen $task $OUT/curve-data 96 21
    .venv/bin/corelens rank --model $M --data $OUT/curve-data/$task.jsonl --query "$(query $task)" \
      --k 1,3,5,8 --overlays 0 --out $OUT/curve-$task
    .venv/bin/corelens stability --curve $OUT/curve-$task --k 1,3,5,8
    cp $OUT/curve-$task/stability_curve.csv $RES/uncertainty-curve-$task.csv
  done
fi

if want ablate; then
  for task in image video document; do
    gen $task $OUT/rank8-data 8 1
    gen $task $OUT/eval-data 40 3
    .venv/bin/corelens rank --model $M --data $OUT/rank8-data/$task.jsonl --query "$(query $task)" \
      --k 1,2,3,5 --overlays 0 --out $OUT/rank8-$task
    .venv/bin/corelens ablate --model $M --data $OUT/eval-data/$task.jsonl --heads $OUT/rank8-$task/heads.csv \
      --k 1,2,3,5 --sets top,random,stable --seeds auto --control-width 0.10 --max-draws 10 --op zero \
      --rank-resamples 20 --out $OUT/ablate-$task
    cp $OUT/ablate-$task/ablation.csv $RES/uncertainty-ablate-$task.csv
    cp $OUT/ablate-$task/ablation_summary.csv $RES/uncertainty-ablate-$task-summary.csv
    cp $OUT/ablate-$task/resampled.csv $RES/uncertainty-ablate-$task-resampled.csv
  done
fi

rank_docs() {  # rank_docs SEED: the document heads on 24 samples of that seed (question rows)
  gen document $OUT/docs-$1 24 $1
  .venv/bin/corelens rank --model $M --data $OUT/docs-$1/document.jsonl --query question \
    --k 1,2,3,5,8,16 --overlays 0 --out $OUT/rank-docs-$1
}

if want hybrid; then
  rank_docs 1
  gen document $OUT/hybrid-data 60 3
  .venv/bin/corelens hybrid --model $M --data $OUT/hybrid-data/document.jsonl --heads $OUT/rank-docs-1/heads.csv \
    --keep 1,2,3,5,8,16 --sets top,random,bottom,stable --seeds auto --control-width 0.10 --max-draws 10 --sink 4 --window 16 \
    --rank-resamples 20 \
    --out $OUT/hybrid-document
  cp $OUT/hybrid-document/hybrid.csv $RES/uncertainty-hybrid-document.csv
  cp $OUT/hybrid-document/hybrid_summary.csv $RES/uncertainty-hybrid-document-summary.csv
  cp $OUT/hybrid-document/resampled.csv $RES/uncertainty-hybrid-document-resampled.csv
fi

if want case; then
  gen document $OUT/case-data 40 12
  for seed in 11 1; do
    [ -f $OUT/rank-docs-$seed/heads.csv ] || rank_docs $seed
    for decode in full stream; do
      .venv/bin/corelens hybrid --model $M --data $OUT/case-data/document.jsonl --heads $OUT/rank-docs-$seed/heads.csv \
        --keep 8 --sets top,random,bottom,stable --seeds auto --control-width 0.10 --max-draws 10 --sink 4 --window 16 \
        --rank-resamples 20 \
        --decode $decode --out $OUT/case-rank$seed-$decode
    done
  done
  .venv/bin/python - "$OUT" "$RES/uncertainty-case.csv" <<'PY'
import sys
from pathlib import Path

import pandas as pd

out, rows = Path(sys.argv[1]), []
for seed, decode in ((11, "full"), (1, "full"), (11, "stream"), (1, "stream")):
    heads = pd.read_csv(out / f"rank-docs-{seed}" / "heads.csv").sort_values("rank")
    table = pd.read_csv(out / f"case-rank{seed}-{decode}" / "hybrid.csv").query("set != 'dense'")
    resampled = pd.read_csv(out / f"case-rank{seed}-{decode}" / "resampled.csv").iloc[0]
    acc = table.groupby("set")["accuracy"]
    summary = pd.read_csv(out / f"case-rank{seed}-{decode}" / "hybrid_summary.csv").set_index("set")
    cell = lambda s: (summary.loc[s, "accuracy"], summary.loc[s, "ci_low"], summary.loc[s, "ci_high"])  # noqa: E731
    name = lambda r: f"L{int(r['layer'])}H{int(r['head'])}"  # noqa: E731
    eighth, ninth = heads.iloc[7], heads.iloc[8]
    rows.append({
        "ranked_on": f"24 seed-{seed} documents", "decode": decode, "top8": " ".join(name(r) for _, r in heads.head(8).iterrows()),
        "rank8": name(eighth), "rank8_mass": eighth.mass, "rank8_p_top8": eighth.p_top8,
        "rank9": name(ninth), "rank9_mass": ninth.mass, "rank9_p_top8": ninth.p_top8,
        **{f"{s}{part}": v for s in ("top", "random", "bottom", "stable") for part, v in zip(("", "_low", "_high"), cell(s))},
        "random_draws": int(summary.loc["random", "seeds"]), "random_min": acc.min()["random"],
        "random_max": acc.max()["random"], "stable_heads": int(table.query("set == 'stable'")["full_heads"].iloc[0]), "resampled_median": resampled["median"], "resampled_low": resampled["low"],
        "resampled_high": resampled["high"], "resampled_distinct_sets": resampled["distinct_sets"],
    })
frame = pd.DataFrame(rows)
frame.to_csv(sys.argv[2], index=False)
print(frame.T.to_string())
PY
fi
