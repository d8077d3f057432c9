"""Adaptive against fixed CoRe hybrid attention on the organism's documents, at equal budgets (issue 21).

Heads ranked on the question rows of 24 seed-1 documents (as `queries.sh`); 60 seed-3 documents evaluated
with S = 4, W = 16 (as `hybrid.sh`) and full-attention decoding. Per budget k of 32 heads: accuracy of the
fixed top-k set and of the adaptive choice (the same per-layer counts, heads chosen per prompt from the
last 16 prompt rows' visual mass), the mean Jaccard of the two sets, and the selection's cost in attention
scores: 16 rows x N keys per head of each layer that chooses, against N² per head of a dense prefill.
No time is measured here (shared CPU). Usage: python hybrid_adaptive.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

import corelens as cl
from corelens.attention.hybrid import HybridPolicy
from corelens.data.sample import read_samples
from corelens.experiments.evaluate import evaluate
from corelens.organism import organism_path
from corelens.organism.tasks import generate

KEEPS, SINK, WINDOW, ROWS = (1, 2, 3, 5, 8, 16), 4, 16, 16


def main(out: Path) -> None:
    m = cl.load(organism_path(), device="cpu")
    ranking = cl.rank(m, generate("document", out / "rank-data", 24, seed=1), query="question", ks=None)
    samples, _ = read_samples(generate("document", out / "eval-data", 60, seed=3))
    heads = m.num_layers * m.num_heads
    dense = evaluate(m, samples)
    rows = [{"keep": heads, "budget": 1.0, "set": "dense", "accuracy": dense.accuracy, "n": dense.n}]
    for keep in KEEPS:
        policy = HybridPolicy.from_heads(ranking.heads, keep, sink=SINK, window=WINDOW)
        fixed = evaluate(m, samples, context=lambda s, p, policy=policy: cl.hybrid(m, policy))
        chosen, lengths, signal_layers = [], [], []

        def adaptive(sample, prepared, keep=keep, log=(chosen, lengths, signal_layers)):
            session = cl.hybrid(
                m, full="adaptive", budget=keep / heads, prior=ranking.heads, sink=SINK, window=WINDOW
            )
            log[1].append(prepared.seq_len)
            return _Recorder(session, log[0], log[2])

        adapted = evaluate(m, samples, context=adaptive)
        full = policy.full_mask(m.num_layers, m.num_heads)
        jaccard = [float((c & full).sum() / (c | full).sum()) for c in chosen]
        n = np.asarray(lengths, dtype=np.float64)
        cost = np.asarray(signal_layers) * m.num_heads * ROWS * n / (m.num_layers * m.num_heads * n**2)
        for name, result in (("fixed", fixed), ("adaptive", adapted)):
            rows.append(
                {
                    "keep": keep,
                    "budget": keep / heads,
                    "set": name,
                    "accuracy": result.accuracy,
                    "n": result.n,
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
