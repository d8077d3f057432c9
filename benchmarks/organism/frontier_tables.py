"""Collect the organism's head rankings of every scorer (scorers.sh, gates.sh) into two result tables.

Reads runs/organism/score-<scorer>-<task>/ (heads.csv and manifest.json) and writes
benchmarks/organism/results/frontier-rankings-heads.csv (every 32-head ranking, one row per scorer, task and
head) and frontier-rankings-timing.csv (each ranking's samples and wall time from its manifest), plus each
task's gates.csv, gate_losses.csv and greedy.csv as results/gates-<task>.csv, gate-losses-<task>.csv and
greedy-<task>.csv. Run from the repository root after the rankings:

    .venv/bin/python benchmarks/organism/frontier_tables.py [RUNS]
"""

import json
import shutil
import sys
from pathlib import Path

import pandas as pd

RUNS = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/organism")
RESULTS = Path("benchmarks/organism/results")
SCORERS = ["causal", "gates", "greedy", "outside-window", "ram", "retrieval"]
COPIES = {
    "gates.csv": "gates-{task}.csv",
    "gate_losses.csv": "gate-losses-{task}.csv",
    "greedy.csv": "greedy-{task}.csv",
}

heads, timing = [], []
for scorer in SCORERS:
    for task in ["document", "image", "video"]:
        run = RUNS / f"score-{scorer}-{task}"
        if not (run / "heads.csv").is_file():
            continue
        manifest = json.loads((run / "manifest.json").read_text())
        ranking = pd.read_csv(run / "heads.csv")
        heads.append(ranking.assign(scorer=scorer, task=task))
        limit = manifest["settings"].get("limit")
        timing.append(
            {"scorer": scorer, "task": task, "samples": limit or 200, "seconds": sum(manifest["timings"])}
        )
        for name, to in COPIES.items():
            if (run / name).is_file():
                shutil.copy(run / name, RESULTS / to.format(task=task))
table = pd.concat(heads, ignore_index=True)
first = ["scorer", "task"]
table[first + [c for c in table.columns if c not in first]].to_csv(
    RESULTS / "frontier-rankings-heads.csv", index=False
)
pd.DataFrame(timing).to_csv(RESULTS / "frontier-rankings-timing.csv", index=False)
print(pd.DataFrame(timing).to_string(index=False))
