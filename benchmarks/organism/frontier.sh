#!/usr/bin/env bash
# The organism frontier (issue 40): every head ranking found for a task compared on one accuracy / KV-cache
# curve, on the 200 seed-3 evaluation samples of rank200.sh (run it, and the scorers' runs, first).
# Rankings: runs/organism/score-<scorer>-<task>/heads.csv (labelled <scorer>) and
# runs/organism/rank-<task>-<query>/heads.csv (rank200.sh's RAM rankings, labelled ram-<query>).
# Each ranking's top set at each budget (full heads; BUDGETS) under hybrid attention (S = 4, W = 16, as
# hybrid.sh for the organism's short prompts) and zeroed; the random control drawn once per task (DRAWS).
# First a 4-sample run times one sample; the estimate for N samples is printed before the real run.
# N (default 200) evaluation samples per task; at N < 200 the results stay under runs/ (a small check),
# at 200 they are copied to results/frontier-<task>{,-budgets,-rankings}.csv and
# docs/figures/organism-<task>-frontier.png.
# GRANULARITY=kv counts the budgets in KV heads (each ranking's KV heads from its query heads); its results
# get a -kv suffix. The runs behind docs/results.md:
#   N=200 BUDGETS=2,4,8,16 DRAWS=2 TASKS=document GRADED=sink+window,top benchmarks/organism/frontier.sh
#   N=200 BUDGETS=2,4 DRAWS=2 TASKS=document GRANULARITY=kv GRADED=sink+window,top benchmarks/organism/frontier.sh
#   N=200 BUDGETS=2,8 DRAWS=2 TASKS="image video" benchmarks/organism/frontier.sh
#   N=8 BUDGETS=2,8 DRAWS=1 TASKS=document benchmarks/organism/frontier.sh   # a small check
set -euo pipefail
OUT=runs/organism
M=src/corelens/organism/checkpoint
N=${N:-200}
BUDGETS=${BUDGETS:-1,2,4,8,16}
DRAWS=${DRAWS:-5}
TASKS=${TASKS:-image video document}
GRANULARITY=${GRANULARITY:-query}
GRADED=${GRADED:-}  # e.g. sink+window,top: graded-budget cells beside the binary ones (frontier --graded)
SUFFIX=$([ "$GRANULARITY" = query ] && echo "" || echo "-$GRANULARITY")
PY=${PY:-.venv/bin/python}
RES=benchmarks/organism/results
for task in $TASKS; do
  data=$OUT/eval-data/$task.jsonl
  [ -f "$data" ] || $PY -c "from corelens.organism.tasks import generate; generate('$task', '$OUT/eval-data', 200, seed=3)"
  heads=()
  for f in $OUT/score-*-"$task"/heads.csv; do
    [ -f "$f" ] || continue
    d=$(basename "$(dirname "$f")"); s=${d#score-}; heads+=("${s%-$task}=$f")
  done
  for f in $OUT/rank-"$task"-*/heads.csv; do
    [ -f "$f" ] || continue
    d=$(basename "$(dirname "$f")"); heads+=("ram-${d#rank-$task-}=$f")
  done
  if [ ${#heads[@]} -eq 0 ]; then echo "frontier: no ranking for $task under $OUT (run rank200.sh first)" >&2; continue; fi
  echo "frontier $task: ${heads[*]}"
  args=(--model $M --data "$data" --heads "${heads[@]}" --budgets "$BUDGETS" --sink 4 --window 16 --draws "$DRAWS" --granularity "$GRANULARITY" ${GRADED:+--graded "$GRADED"})
  timing=$OUT/frontier-$task$SUFFIX-timing
  rm -rf "$timing"
  start=$(date +%s)
  $PY -m corelens frontier "${args[@]}" --limit 4 --out "$timing" > /dev/null
  secs=$(( $(date +%s) - start ))
  echo "frontier $task: 4 samples took ${secs} s; $N samples: about $(( secs * N / 4 / 60 )) min"
  run=$OUT/frontier-$task$SUFFIX-n$N
  $PY -m corelens frontier "${args[@]}" --limit "$N" --out "$run"
  if [ "$N" -ge 200 ]; then
    cp "$run/frontier.csv" "$RES/frontier-$task$SUFFIX.csv"
    cp "$run/frontier_budgets.csv" "$RES/frontier-$task$SUFFIX-budgets.csv"
    cp "$run/rankings.csv" "$RES/frontier-$task$SUFFIX-rankings.csv"
    $PY - "$RES/frontier-$task$SUFFIX.csv" "docs/figures/organism-$task$SUFFIX-frontier.png" "$task" <<'PY'
import sys

import pandas as pd

from corelens.report.frontier_curves import frontier_figure

table = pd.read_csv(sys.argv[1])
n = int(table["n"].max())
frontier_figure(table, sys.argv[2], title=f"organism {sys.argv[3]}: hybrid accuracy on {n} samples (S=4, W=16)")
print(f"wrote {sys.argv[1]} and {sys.argv[2]}")
PY
  else
    echo "frontier $task: N=$N < 200: results left in $run (not copied to $RES)"
  fi
done
