"""Does the 8-head hybrid result hang on the 8th head? (issue 33)

The 200-document ranking (`rank200.sh`, question rows) puts L0H3 8th with P(top-8) about 0.5. This keeps
full the top 7 plus the 9th head instead of the 8th, on `hybrid.sh`'s 200 seed-3 documents (S = 4, W = 16,
full-attention decoding), and writes the accuracy with its Wilson interval and the paired interval of
the difference to the top 8 (hybrid.sh's answers). Usage: python hybrid_swap.py OUT (rank200.sh's folder)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

import corelens as cl
from corelens.data.sample import read_samples
from corelens.experiments.evaluate import evaluate, interval
from corelens.organism import organism_path
from corelens.policies import HybridAttention


def main(out: Path) -> None:
    m = cl.load(organism_path(), device="cpu")
    ranked = pd.read_csv(out / "rank-document-question" / "heads.csv").sort_values("rank")
    heads = [(int(r.layer), int(r.head)) for r in ranked.itertuples()]
    swapped = heads[:7] + [heads[8]]
    samples, _ = read_samples(out / "eval-data" / "document.jsonl")
    policy = HybridAttention(tuple(sorted(swapped)), 4, 16, source={"kind": "top 7 + 9th"})
    got = evaluate(m, samples, context=lambda s, p: policy.applied(m, p)).records.set_index("id")["correct"]
    top8 = pd.read_parquet(out / "hybrid-document-question" / "records.parquet").query("condition == 'top/8'")
    top8 = top8.set_index("sample")["correct"].loc[got.index]
    diff = got.to_numpy(float) - top8.to_numpy(float)
    rows = np.random.default_rng(0).integers(0, len(diff), (2000, len(diff)))
    d_low, d_high = np.quantile(diff[rows].mean(axis=1), [0.025, 0.975])
    low, high = interval(int(got.sum()), len(got))
    label = lambda hs: " ".join(f"L{a}H{b}" for a, b in sorted(hs))  # noqa: E731
    pd.DataFrame(
        [
            {"set": "top 8", "heads": label(heads[:8]), "accuracy": top8.mean(), "n": len(top8)},
            {"set": "top 7 + 9th", "heads": label(swapped), "accuracy": got.mean(), "n": len(got),
             "ci_low": low, "ci_high": high, "diff_vs_top8": diff.mean(), "diff_low": d_low, "diff_high": d_high},
        ]
    ).to_csv(out / "hybrid-swap-document.csv", index=False)  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
