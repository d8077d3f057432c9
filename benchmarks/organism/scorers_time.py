"""Ranking time of each head scorer against RAM's on the same organism data (issue 40's target: <= 1.2x RAM).

Per task: N seed-1 samples (env N, default 24), the answer rows (`--query answer`); one loaded organism,
`rank()` in memory (the tables and bootstrap intervals of every scorer included, no run folder), each
scorer timed REPEATS times (env REPEATS, default 3) interleaved with RAM in one process, the median kept.
outside-window uses the hybrid table's S = 4, W = 16. Writes OUT/scorers-time.csv: task, scorer, samples,
median seconds, ratio to RAM's median on the same task.
Usage: python scorers_time.py OUT
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

import corelens as cl
from corelens.organism import organism_path
from corelens.organism.tasks import generate

SCORES = {
    "ram": {},
    "retrieval": {},
    "outside-window": {"sink": "4", "window": "16"},
    "causal": {"effect": "exact"},
    "causal-attribution": {"score": "causal", "effect": "attribution"},
}


def main(out: Path) -> None:
    n, repeats = int(os.environ.get("N", "24")), int(os.environ.get("REPEATS", "3"))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    m = cl.load(organism_path(), device="cpu")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in ("image", "video", "document"):
            data = generate(task, Path(tmp), n, seed=1)
            times = {name: [] for name in SCORES}
            for _ in range(repeats):
                for name, settings in SCORES.items():
                    settings = {"score": name, **settings}
                    start = time.perf_counter()
                    cl.rank(m, data, query="answer", progress=False, **settings)
                    times[name].append(time.perf_counter() - start)
            base = statistics.median(times["ram"])
            for name, seconds in times.items():
                median = statistics.median(seconds)
                rows.append({"task": task, "scorer": name, "samples": n, "seconds": round(median, 3),
                             "ratio_to_ram": round(median / base, 2)})  # fmt: skip
                print(rows[-1], flush=True)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "scorers-time.csv", index=False)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
