"""The flash candidate for the streaming heads (attention/kernels/flashstream.py), on the CPU.

flash-attention does not run on a CPU, so the windowed primitive is injected: `reference_windowed` (the same
contract computed densely) for the orchestration, and a fake of `aten._flash_attention_forward` written here
from flash-attention's documented mask (bottom-right aligned, left / right window, a window reaching past the
keys turned off) for the CUDA adapter's arguments. The reference is dense attention in float64 under the rule
written out here, independently of masks.py: query i of a row starting at s keeps key j iff s <= j <= i and
(j - s < S or i - j < W); padding rows are zeros.
"""

from __future__ import annotations

import pytest
import torch

from corelens.attention.kernels import Pattern, flashstream, partitioned
from corelens.attention.kernels import partition as part
from corelens.attention.kernels import stream as triton_stream

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def rule(q, k, v, full, starts, sink, window, scale):
    """Return (batch, n, heads, dim_v) float64: streaming heads under the rule, full heads causal."""
    batch, heads, n, _ = q.shape
    group = heads // k.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    out = torch.zeros(batch, n, heads, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        s = int(starts[b])
        causal = (j <= i) & (j >= s)
        for h in range(heads):
            keep = causal if full[h] else causal & ((j - s < sink) | (i - j < window))
            scores = (q[b, h].double() @ k[b, h // group].double().T * scale).masked_fill(
                ~keep, float("-inf")
            )
            out[b, :, h] = torch.softmax(scores, -1).nan_to_num(0.0) @ v[b, h // group].double()
    return out


def _inputs(batch, heads, kv_heads, n, dim=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n, heads, dim, generator=g).to(dtype).transpose(1, 2)  # the model's strided layout
    k = torch.randn(batch, n, kv_heads, dim, generator=g).to(dtype).transpose(1, 2)
    v = torch.randn(batch, n, kv_heads, dim, generator=g).to(dtype).transpose(1, 2)
    return q, k, v


def _model_mask(starts, n):
    real = torch.arange(n)[None, :] >= torch.tensor(starts)[:, None]
    return (torch.ones(n, n, dtype=torch.bool).tril()[None] & real[:, None, :])[:, None], real


# Every S in {0, 1, 4, 17} x W from 1 to past n at n = 37; 8 query heads over 2 KV heads with a scattered full
# set (streaming calls of 3 and 4 heads per KV head), rows starting at 0 and 5; float64 end to end. The merge
# runs under Triton's interpreter (about 1 s a case): four cases in `make check`, the whole grid in `make test`.
FAST = {(0, 1), (4, 16), (17, 17), (1, 40)}
GRID = [
    pytest.param(s, w, marks=() if (s, w) in FAST else pytest.mark.e2e)
    for s in (0, 1, 4, 17)
    for w in (1, 2, 16, 17, 40)
]


@pytest.mark.parametrize("sink,window", GRID)
def test_flash_stream_equals_the_rule_float64(sink, window):
    q, k, v = _inputs(2, 8, 2, 37, seed=sink * 50 + window)
    full = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    mask, real = _model_mask([0, 5], 37)
    got = partitioned(q, k, v, mask, full, Pattern(sink, window), 0.3, stream="flash")
    want = rule(q, k, v, full, [0, 5], sink, window, 0.3)
    assert got.dtype == torch.float64
    assert torch.allclose(got * real[:, :, None, None], want, atol=1e-10), (sink, window)


@pytest.mark.parametrize("groups", [1, 2, 4, 8])
def test_flash_stream_gqa_groups(groups):
    q, k, v = _inputs(1, 8, 8 // groups, 29, seed=groups)
    full = torch.zeros(8, dtype=torch.bool)
    got = partitioned(q, k, v, None, full, Pattern(2, 9), 0.3, stream="flash")
    assert torch.allclose(got, rule(q, k, v, full, [0], 2, 9, 0.3), atol=1e-10)


@pytest.mark.parametrize(
    "n,sink,window,starts", [(53, 5, 20, [0, 11]), (70, 8, 30, [29, 0]), (45, 3, 7, [44, 40])]
)
def test_flash_stream_odd_lengths_and_padding(n, sink, window, starts):
    q, k, v = _inputs(len(starts), 4, 2, n, seed=n)
    full = torch.tensor([0, 1, 0, 0], dtype=torch.bool)
    mask, real = _model_mask(starts, n)
    got = partitioned(q, k, v, mask, full, Pattern(sink, window), 0.3, stream="flash")
    assert torch.allclose(
        got * real[:, :, None, None], rule(q, k, v, full, starts, sink, window, 0.3), atol=1e-10
    )
    for b, s in enumerate(starts):
        assert not got[b, :s].any()


def flash_keeps(nq, nk, left, right, causal):
    """flash-attention's mask as documented: query i keeps key j iff i + nk - nq - left <= j <= i + nk - nq + right
    (bottom-right aligned); -1 (or None) is no limit, a limit >= nk is none, and causal sets right = 0."""
    left = -1 if left is None or left >= nk else left
    right = -1 if right is None or right >= nk else right
    right = 0 if causal else right
    i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    keep = torch.ones(nq, nk, dtype=torch.bool)
    if left >= 0:
        keep &= j >= i + nk - nq - left
    if right >= 0:
        keep &= j <= i + nk - nq + right
    return keep


def fake_flash(calls):
    """A stand-in for aten._flash_attention_forward on a CPU: flash's mask (`flash_keeps`) from its arguments."""

    def op(
        q,
        k,
        v,
        cum_q,
        cum_k,
        max_q,
        max_k,
        dropout,
        causal,
        debug,
        *,
        scale,
        window_size_left,
        window_size_right,
    ):
        assert (
            q.dim() == 4
            and q.shape[2] % k.shape[2] == 0
            and (cum_q, cum_k, dropout, debug) == (None, None, 0.0, False)
        )
        assert (max_q, max_k) == (q.shape[1], k.shape[1]) and q.stride(-1) == k.stride(-1) == v.stride(
            -1
        ) == 1
        calls.append((q.shape[1], k.shape[1], causal, window_size_left, window_size_right))
        keep = flash_keeps(q.shape[1], k.shape[1], window_size_left, window_size_right, causal)
        group = q.shape[2] // k.shape[2]
        kh, vh = (x.transpose(1, 2).float().repeat_interleave(group, 1) for x in (k, v))
        scores = (q.transpose(1, 2).float() @ kh.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
        lse = scores.logsumexp(-1)
        out = ((scores - lse[..., None]).exp() @ vh).transpose(1, 2).to(q.dtype)
        return out, lse, None, None, None

    return op


def test_the_flash_adapter_builds_flash_arguments_that_keep_the_rule(monkeypatch):
    calls = []
    monkeypatch.setattr(flashstream, "_flash_op", lambda: fake_flash(calls))
    q, k, v = _inputs(1, 4, 2, 50, seed=1, dtype=torch.bfloat16)
    full = torch.tensor([0, 0, 1, 0], dtype=torch.bool)
    got = partitioned(
        q, k, v, None, full, Pattern(4, 11), 0.3, stream="flash", windowed=flashstream.flash_windowed
    )
    want = rule(q, k, v, full, [0], 4, 11, 0.3)
    assert (got.double() - want).abs().max() < 3e-2
    # Per streaming call: the window pass (W - 1 to the left), the sink triangle (square, causal), the rest.
    assert calls[:3] == [(50, 50, True, 10, 0), (4, 4, True, None, None), (35, 4, False, None, None)]


def test_flash_window_semantics_match_the_rule():
    # The rule's window i - j < W is flash's left window W - 1 (with causal), for every W up to past n.
    n = 12
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    q = torch.zeros(1, n, 2, 8)
    for window in range(1, n + 3):
        _, kwargs = flashstream.flash_args(q, q, q, causal=True, window=window, scale=1.0)
        keeps = flash_keeps(n, n, kwargs["window_size_left"], kwargs["window_size_right"], True)
        assert torch.equal(keeps, (j <= i) & (i - j < window)), window
    # Why the sink pass is split: a causal call with fewer keys than queries is aligned bottom-right.
    assert not torch.equal(flash_keeps(6, 3, None, None, True), torch.ones(6, 3, dtype=torch.bool).tril())


def test_flash_needs_16_bit_inputs_and_a_causal_window():
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="float16 / bfloat16"):
        flashstream.flash_windowed(q, q, q, causal=True, window=2, scale=1.0)
    with pytest.raises(ValueError, match="causal=True"):
        flashstream.flash_args(q, q, q, causal=False, window=2, scale=1.0)


@pytest.mark.skipif(
    not triton_stream.available() or not triton_stream.interpreting(),
    reason="needs triton under TRITON_INTERPRET=1",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_merge_equals_the_merge_in_torch(dtype):
    g = torch.Generator().manual_seed(0)
    out = torch.randn(2, 70, 3, 24, generator=g).to(dtype)[:, 5:]  # a strided row slice, as the sink rows are
    other = torch.randn(2, 65, 3, 24, generator=g).to(dtype)
    lse, other_lse = (torch.randn(2, 3, 70, generator=g).to(dtype)[..., 5:] for _ in range(2))
    before, torch_merged = out.double().clone(), out.clone()
    flashstream.merge_torch(torch_merged, lse, other, other_lse)
    flashstream.merge_(out, lse, other, other_lse)
    # The merge of two softmaxes over disjoint keys: each side weighted by its share of the total exp-sum.
    total = torch.logaddexp(lse.double(), other_lse.double()).transpose(1, 2)[..., None]
    want = before * (lse.double().transpose(1, 2)[..., None] - total).exp()
    want += other.double() * (other_lse.double().transpose(1, 2)[..., None] - total).exp()
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert torch.allclose(out.double(), want, atol=tol) and torch.allclose(
        torch_merged.double(), want, atol=tol
    )


def test_two_streams_are_one_on_the_cpu_with_identical_results():
    q, k, v = _inputs(2, 8, 2, 41, seed=4, dtype=torch.float32)
    full = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0], dtype=torch.bool)
    mask, _ = _model_mask([0, 3], 41)
    for stream in ("flex", "flash"):
        one = partitioned(q, k, v, mask, full, Pattern(2, 9), 0.3, stream=stream)
        two = partitioned(q, k, v, mask, full, Pattern(2, 9), 0.3, stream=stream, streams=2)
        assert torch.equal(one, two)
    assert part.two_streams(2, torch.device("cpu")) == 1 and part.two_streams(2, torch.device("cuda")) == 2
    with pytest.raises(ValueError, match="streams must be 1 or 2"):
        part.two_streams(3, torch.device("cpu"))


def test_auto_keeps_the_stream_the_table_measured_faster(monkeypatch):
    from corelens.attention.kernels import crossover

    cuda = torch.device("cuda")
    monkeypatch.setattr(triton_stream, "available", lambda: True)
    monkeypatch.setattr(crossover, "active", lambda device: None)
    assert part.default_stream(cuda) == "triton" and part.default_stream(torch.device("cpu")) == "flex"
    table = crossover.Crossover("NVIDIA H200", (0.2,), (8192.0,), stream="flash")
    monkeypatch.setattr(crossover, "active", lambda device: table)
    assert part.default_stream(cuda) == "flash"
