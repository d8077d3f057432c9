"""TME of the organism's real layer states against the sharpening α (backs the default of `corelens flow`).

For each task, the first 20 of the 60 seed-3 samples that flow.sh uses: every decoder layer's input state
(all prompt positions, fp32, captured by `ResidualCapture`), its TME at each α of the grid, and also the
attention output X + ΔX_attn and the layer output (the states MixIG compares). Writes one row per
(task, state, layer, α) with the median, quartiles and minimum over samples, and the same pooled over the
three tasks and four layers (task and layer 'all').

    PYTHONPATH=src .venv/bin/python benchmarks/organism/tme_alpha.py benchmarks/organism/results/tme-alpha.csv
"""

from __future__ import annotations

import sys
import tempfile

import pandas as pd
import torch

import corelens
from corelens.capture import ResidualCapture
from corelens.metrics import tme
from corelens.models.prepare import prepare
from corelens.organism.tasks import generate

ALPHAS = (1, 2, 4, 8, 16, 32, 64, 128)
TASKS = ("image", "video", "document")
SAMPLES = 20


def states_of(m, sample) -> list[tuple[int, str, torch.Tensor]]:
    """Return (layer, state, matrix) for the layer input, post-attention sum and layer output."""
    p = prepare(m, sample)
    got = []
    with torch.no_grad(), ResidualCapture(m, got.append):
        m.model(**p.inputs, use_cache=False, logits_to_keep=1)
    return [
        (s.layer, name, x) for s in got for name, x in (("in", s.x_in), ("mid", s.x_mid), ("out", s.x_out))
    ]


def main(out: str) -> None:
    m = corelens.load("src/corelens/organism/checkpoint")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in TASKS:
            samples = corelens.read_samples(generate(task, tmp, 60, seed=3))[0][:SAMPLES]
            for sample in samples:
                for layer, state, x in states_of(m, sample):
                    for alpha in ALPHAS:
                        rows.append(
                            {
                                "task": task,
                                "sample_id": sample.id,
                                "state": state,
                                "layer": layer,
                                "alpha": alpha,
                                "tme": tme(x, alpha=alpha),
                            }
                        )
    frame = pd.DataFrame(rows)
    pooled = frame.assign(task="all", layer="all")  # every task and layer together
    parts = []
    for part in (frame.astype({"layer": str}), pooled):
        q = part.groupby(["task", "state", "layer", "alpha"])["tme"]
        stats = {"median": q.median(), "q25": q.quantile(0.25), "q75": q.quantile(0.75), "min": q.min()}
        parts.append(pd.concat({**stats, "states": q.size()}, axis=1).reset_index())
    pd.concat(parts).to_csv(out, index=False, float_format="%.4f")
    inputs = frame[frame["state"] == "in"]
    print("median TME of every layer input (3 tasks x 4 layers x 20 samples) per alpha:")
    print(
        inputs.groupby("alpha")["tme"].describe(percentiles=[0.25, 0.5, 0.75]).to_string(float_format="%.3f")
    )


if __name__ == "__main__":
    main(sys.argv[1])
