"""The Triton streaming kernel (attention/kernels/stream.py) under Triton's interpreter, against the rule written out.

The reference is dense attention in float64 under an explicit mask built here, independently of masks.py: query
i of a batch row starting at s keeps key j iff s <= j <= i and (j - s < S or i - j < W); a padding row (i < s)
comes out as zeros. Small prompts, every tile class: sinks past / inside the window, far-edge and diagonal tiles,
unmasked middle tiles, lengths that are multiples of no tile, left padding, GQA head tables.
"""

from __future__ import annotations

import pytest
import torch

from corelens.attention.kernels import Pattern, partitioned
from corelens.attention.kernels import stream as triton_stream

pytestmark = pytest.mark.skipif(
    not triton_stream.available() or not triton_stream.interpreting(),
    reason="needs triton under TRITON_INTERPRET=1 (tests/conftest.py sets it before triton is imported)",
)


def rule(q, k, v, heads, kv_heads, starts, sink, window, scale):
    """Return (batch, n, heads, dim_v) float64: each listed head under the streaming rule; other heads zero."""
    batch, all_heads, n, _ = q.shape
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    out = torch.zeros(batch, n, all_heads, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        s = int(starts[b])
        keep = (j <= i) & (j >= s) & ((j - s < sink) | (i - j < window))
        for h, g in zip(heads, kv_heads):
            scores = (q[b, h].double() @ k[b, g].double().T * scale).masked_fill(~keep, float("-inf"))
            out[b, :, h] = torch.softmax(scores, -1).nan_to_num(0.0) @ v[b, g].double()
    return out


def _inputs(batch, heads, kv_heads, n, dim=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dim, generator=g).to(dtype).transpose(1, 2)  # the model's strided layout
    k = torch.randn(batch, kv_heads, n, dim, generator=g).to(dtype)
    v = torch.randn(batch, kv_heads, n, dim, generator=g).to(dtype)
    return q, k, v


def _run(q, k, v, heads, kv_heads, starts, pattern, scale=0.3, **blocks):
    out = torch.full((q.shape[0], q.shape[2], q.shape[1], v.shape[-1]), 5.0, dtype=q.dtype)
    triton_stream.streaming_into(
        out, q, k, v, heads, kv_heads, torch.tensor(starts), pattern, scale, **blocks
    )  # fmt: skip
    return out


# Every S in {0, 1, 4, 17} x every W from 1 to past n, at n = 37 (three 16-row tiles, the last cut), three
# heads of two KV heads (a partial GQA table), rows starting at 0 and at 5 (left padding).
@pytest.mark.parametrize("sink", [0, 1, 4, 17])
@pytest.mark.parametrize("window", [1, 2, 16, 17, 40])
def test_streaming_kernel_equals_the_rule_fp32(sink, window):
    q, k, v = _inputs(2, 4, 2, 37, seed=sink * 50 + window)
    heads, kv = [0, 1, 3], [0, 0, 1]
    got = _run(q, k, v, heads, kv, [0, 5], Pattern(sink, window), block_m=16, block_n=16)
    want = rule(q, k, v, heads, kv, [0, 5], sink, window, 0.3)
    assert torch.allclose(got[:, :, heads].double(), want[:, :, heads], atol=2e-5), (sink, window)
    assert torch.equal(got[:, :, 2], torch.full_like(got[:, :, 2], 5.0))  # a full head's slice is untouched


# Tile shapes other than square (more far-edge / diagonal tiles per query tile), odd lengths and paddings.
@pytest.mark.parametrize(
    "n,sink,window,starts,block_m,block_n",
    [
        (1, 2, 3, [0], 16, 16),
        (16, 3, 4, [0], 16, 16),
        (53, 5, 20, [0, 11], 32, 16),
        (53, 5, 20, [3, 0], 16, 32),
        (70, 8, 30, [29, 0], 16, 16),
        (45, 3, 7, [44, 40], 16, 16),  # rows of one real token and of five
    ],
)
def test_streaming_kernel_tile_shapes_and_padding(n, sink, window, starts, block_m, block_n):
    q, k, v = _inputs(len(starts), 2, 1, n, dim=24, seed=n)
    got = _run(q, k, v, [0, 1], [0, 0], starts, Pattern(sink, window), block_m=block_m, block_n=block_n)
    want = rule(q, k, v, [0, 1], [0, 0], starts, sink, window, 0.3)
    assert torch.allclose(got.double(), want, atol=2e-5)
    for b, s in enumerate(starts):
        assert not got[b, :s].any()  # padding rows are zeros


# GQA: every group size of 8 query heads (1, 2, 4, 8 per KV head), all heads streaming.
@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_streaming_kernel_gqa_groups(groups):
    q, k, v = _inputs(1, 8, 8 // groups, 29, seed=groups)
    heads = list(range(8))
    kv = [h // groups for h in heads]
    got = _run(q, k, v, heads, kv, [0], Pattern(2, 9), block_m=16, block_n=16)
    assert torch.allclose(got.double(), rule(q, k, v, heads, kv, [0], 2, 9, 0.3), atol=2e-5)


@pytest.mark.parametrize("sink,window", [(4, 16), (0, 5), (17, 33)])
def test_streaming_kernel_bf16_within_tolerance(sink, window):
    q, k, v = _inputs(2, 4, 2, 41, seed=7, dtype=torch.bfloat16)
    heads, kv = [0, 1, 2, 3], [0, 0, 1, 1]
    got = _run(q, k, v, heads, kv, [0, 6], Pattern(sink, window), block_m=16, block_n=16)
    want = rule(q, k, v, heads, kv, [0, 6], sink, window, 0.3)
    assert got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max() < 3e-2


def test_partitioned_triton_stream_equals_the_rule_with_full_heads_and_padding():
    q, k, v = _inputs(2, 8, 2, 45, seed=3)
    full = torch.tensor([1, 0, 0, 0, 0, 1, 0, 0], dtype=torch.bool)
    starts = [0, 9]
    real = torch.arange(45)[None, :] >= torch.tensor(starts)[:, None]
    model = (torch.ones(45, 45, dtype=torch.bool).tril()[None] & real[:, None, :])[:, None]
    got = partitioned(q, k, v, model, full, Pattern(3, 7), 0.25, stream="triton")
    want = rule(q, k, v, range(8), [h // 4 for h in range(8)], starts, 3, 7, 0.25)  # streaming heads
    dense = rule(q, k, v, range(8), [h // 4 for h in range(8)], starts, 45, 45, 0.25)  # every real key
    want[:, :, full] = dense[:, :, full]
    assert torch.allclose(got.double() * real[:, :, None, None], want, atol=2e-5)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setattr(triton_stream, "interpreting", lambda: False)
    q, k, v = _inputs(1, 1, 1, 4)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        _run(q, k, v, [0], [0], [0], Pattern(1, 2))
