"""The compiled FlexAttention path once on the CPU (Inductor's CPU flex template), against the rule written out.

About a minute on one core (the first compile of a process): marked `e2e` ("a first kernel build"), so `make test`
runs it and `make check` leaves it out. The partitioned kernel's flex passes (`stream="flex"`) need the
log-sum-exp, which Inductor's CPU template does not return in torch 2.14 ("`return_lse` is not supported yet"),
so on the CPU they run uncompiled (tests/test_kernels_split.py); the GPU run checks them compiled
(`corelens.bench.kernel_parity`).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from corelens.attention.kernels import Pattern, flex

pytestmark = pytest.mark.e2e


def rule(q, k, v, full, sink, window, scale):
    """Return (batch, n, heads, dim) float64: query i keeps key j iff j <= i and (full, j < S or i - j < W)."""
    heads, n = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    out = torch.empty(q.shape[0], n, heads, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        keep = (j <= i) & (bool(full[h]) | (j < sink) | (i - j < window))
        scores = (q[:, h].double() @ k[:, h // group].double().transpose(-1, -2) * scale).masked_fill(
            ~keep, -torch.inf
        )
        out[:, :, h] = torch.softmax(scores, -1) @ v[:, h // group].double()
    return out


def test_compiled_flex_on_the_cpu_equals_the_rule():
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(0)
    n = 300  # three 128-blocks, the last partial: whole, partial and empty blocks of the hybrid block mask
    q = torch.randn(2, 4, n, 16, generator=g)
    k, v = torch.randn(2, 2, n, 16, generator=g), torch.randn(2, 2, n, 16, generator=g)
    full = torch.tensor([True, False, False, False])
    frames = counters["frames"]["total"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # FlexAttention run unfused warns: here it is an error
        with torch.no_grad():
            got = flex(q, k, v, None, full, Pattern(4, 64), 0.25, compiled=True)
    assert counters["frames"]["total"] > frames  # dynamo compiled it (Inductor raises rather than fall back)
    assert not counters["graph_break"]
    assert torch.allclose(got.double(), rule(q, k, v, full, 4, 64, 0.25), atol=1e-5)
