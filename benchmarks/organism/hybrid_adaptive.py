"""Adaptive against fixed CoRe hybrid attention on the organism's documents, at equal budgets (issue 21).

Heads ranked on the question rows of 200 seed-1 documents (`rank200.sh`, run it first); 200 seed-3
documents evaluated with S = 4, W = 16 (as `hybrid.sh`) and full-attention decoding. Per budget k of 32 heads: accuracy of the
fixed top-k set and of the adaptive choice (k = 8 and 16) (the same per-layer counts, heads chosen per prompt from the
last 16 prompt rows' visual mass), the mean Jaccard of the two sets, and the selection's cost in attention
scores: 16 rows x N keys per head of each layer that chooses, against N² per head of a dense prefill.
Each accuracy has its Wilson interval; `diff_low` / `diff_high` bound adaptive minus fixed (a paired
bootstrap over the documents, 2000 resamples, 95 %).
No time is measured here (shared CPU). Usage: python hybrid_adaptive.py OUT (OUT = rank200.sh's folder)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

import corelens as cl
from corelens.data.sample import read_samples
from corelens.experiments.evaluate import EvalResult, evaluate, interval
from corelens.organism import organism_path
from corelens.policies import HybridAttention

KEEPS, SINK, WINDOW, ROWS = (8, 16), 4, 16, 16  # the budget of one shared 2-core machine


def paired(adaptive: np.ndarray, fixed: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Return the 95 % bootstrap interval of mean(adaptive - fixed) over the same documents."""
    diff = adaptive.astype(float) - fixed.astype(float)
    rows = np.random.default_rng(seed).integers(0, len(diff), (n_boot, len(diff)))
    return tuple(float(v) for v in np.quantile(diff[rows].mean(axis=1), [0.025, 0.975]))


def stored(out: Path, name: str, samples) -> EvalResult | None:
    """Return `hybrid.sh`'s answers under condition `name` (top/8, dense...) in sample order, if it ran."""
    path = out / "hybrid-document-question" / "records.parquet"
    if not path.is_file():
        return None
    got = pd.read_parquet(path).query("condition == @name").set_index("sample")
    if len(got) != len(samples):
        return None
    return EvalResult(got.loc[[s.id for s in samples]].reset_index().rename(columns={"sample": "id"}))


def main(out: Path) -> None:
    m = cl.load(organism_path(), device="cpu")
    ranked = pd.read_csv(out / "rank-document-question" / "heads.csv")
    samples, _ = read_samples(out / "eval-data" / "document.jsonl")
    heads = m.num_layers * m.num_heads
    # The dense and fixed answers are hybrid.sh's where it ran (the same policies on the same documents).
    dense = stored(out, "dense", samples) or evaluate(m, samples)
    low, high = interval(int(dense.records["correct"].sum()), dense.n)
    rows = [{"keep": heads, "budget": 1.0, "set": "dense", "accuracy": dense.accuracy, "n": dense.n,
             "ci_low": low, "ci_high": high}]  # fmt: skip
    for keep in KEEPS:
        policy = HybridAttention.from_heads(ranked, keep, sink=SINK, window=WINDOW)
        fixed = stored(out, f"top/{keep}", samples) or evaluate(
            m, samples, context=lambda s, p, policy=policy: policy.applied(m, p)
        )
        chosen, lengths, signal_layers = [], [], []

        def adaptive(sample, prepared, keep=keep, log=(chosen, lengths, signal_layers)):
            session = cl.hybrid(
                m, full="adaptive", budget=keep / heads, prior=ranked, sink=SINK, window=WINDOW
            )
            log[1].append(prepared.seq_len)
            return _Recorder(session, log[0], log[2])

        adapted = evaluate(m, samples, context=adaptive)
        full = policy.plan().full_mask(m.num_layers, m.num_heads)
        jaccard = [float((c & full).sum() / (c | full).sum()) for c in chosen]
        n = np.asarray(lengths, dtype=np.float64)
        cost = np.asarray(signal_layers) * m.num_heads * ROWS * n / (m.num_layers * m.num_heads * n**2)
        diff = paired(adapted.records["correct"].to_numpy(), fixed.records["correct"].to_numpy())
        for name, result in (("fixed", fixed), ("adaptive", adapted)):
            low, high = interval(int(result.records["correct"].sum()), result.n)
            rows.append(
                {
                    "keep": keep,
                    "budget": keep / heads,
                    "set": name,
                    "accuracy": result.accuracy,
                    "n": result.n,
                    "correct": int(result.records["correct"].sum()),
                    "ci_low": low,
                    "ci_high": high,
                    "diff_vs_fixed": adapted.accuracy - fixed.accuracy if name == "adaptive" else 0.0,
                    "diff_low": diff[0] if name == "adaptive" else 0.0,
                    "diff_high": diff[1] if name == "adaptive" else 0.0,
                    "jaccard_vs_fixed": float(np.mean(jaccard)) if name == "adaptive" else 1.0,
                    "selection_scores_vs_dense_prefill": float(cost.mean()) if name == "adaptive" else 0.0,
                    "prompt_tokens": float(n.mean()),
                }
            )
    pd.DataFrame(rows).to_csv(out / "hybrid-adaptive-document.csv", index=False)


class _Recorder:
    """Enter a hybrid session; on exit, keep the full-head table its prefill chose and its signal count."""

    def __init__(self, session, chosen: list, signal_layers: list) -> None:
        self.session, self.chosen, self.signal_layers = session, chosen, signal_layers

    def __enter__(self):
        self.h = self.session.__enter__()
        return self.h

    def __exit__(self, *exc):
        self.chosen.append(self.h.hook.chosen[0])
        self.signal_layers.append(self.h.stats["signal"])
        return self.session.__exit__(*exc)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
