"""Hybrid attention kernels against the dense masked reference (docs/methods.md#hybrid), at the kernel interface."""

from __future__ import annotations

import pytest
import torch

from corelens.attention import kernels
from corelens.attention.kernels import Pattern, band, blocked, causal, flex, reference, split, tiles, tiling
from corelens.attention.kernels.causal import causal_balanced
from corelens.attention.kernels.flexattn import policy_block_mask
from corelens.attention.kernels.masks import hybrid_mask_function, pairs, row_starts, streaming_keep

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def _inputs(batch, heads, groups, n, dim=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, dim, generator=g).to(dtype)
    k = torch.randn(batch, heads // groups, n, dim, generator=g).to(dtype)
    v = torch.randn(batch, heads // groups, n, dim, generator=g).to(dtype)
    full = torch.rand(heads, generator=g) < 0.4
    return q, k, v, full


def _left_padded(pads, n):
    keep = torch.ones(len(pads), n, dtype=torch.bool)
    for row, pad in enumerate(pads):
        keep[row, :pad] = False
    return torch.ones(n, n, dtype=torch.bool).tril()[None, None] & keep[:, None, None, :]


def test_streaming_rule_is_the_documented_one_and_pairs_count_it():
    q = torch.arange(40)[None]
    k = torch.arange(40)[None]
    keep = streaming_keep(q, k, torch.zeros(1, dtype=torch.long), Pattern(3, 5))[0]
    want = torch.tensor([[j <= i and (j < 3 or i - j < 5) for j in range(40)] for i in range(40)])
    assert torch.equal(keep, want)
    assert pairs(40, 3, 5) == (40 * 41 // 2, int(want.sum()))
    assert pairs(10, 3, 8)[1] == pairs(10, 3, 8)[0]  # N <= S + W: nothing dropped


# Lengths that are multiples of no block size (blocks are 32..128 positions; flex tiles 128).
# path: the C++ band kernel; the split tiles (middle in place + masked edges) where B <= W, else masked tiles;
# the masked tiles.
@pytest.mark.parametrize("path", tiles.PATHS)
@pytest.mark.parametrize("groups", [1, 2, 3, 4])
@pytest.mark.parametrize("n,sink,window", [(37, 4, 8), (157, 5, 40), (301, 16, 64), (130, 0, 7)])
def test_blocked_equals_reference(groups, n, sink, window, path):
    q, k, v, full = _inputs(1, 4 * groups if groups < 4 else 8, groups, n, seed=n + groups)
    scale = 16**-0.5
    ref = reference(q, k, v, None, full, Pattern(sink, window), scale)
    for block in (None, 8, 2):  # the default; many tiles per row; the smallest split block
        out = blocked(q, k, v, None, full, Pattern(sink, window), scale, block=block, path=path)
        assert (out - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("out_bytes", [1, tiling.OUT_BYTES])  # one tile per call; all tiles in one call
@pytest.mark.parametrize("full_heads", [[4], [1, 5, 6]])  # streaming heads 5-7; runs 0 | 2-3 and 4 | 7
@pytest.mark.parametrize("path", tiles.PATHS)
def test_blocked_tile_chunks_and_head_runs_equal_reference(monkeypatch, path, full_heads, out_bytes):
    """Whole tiles merge straight into the output, run by run of consecutive heads; a partial one through a copy."""
    monkeypatch.setattr(tiling, "OUT_BYTES", out_bytes)
    q, k, v, _ = _inputs(1, 8, 4, 157, seed=11)
    full = torch.zeros(8, dtype=torch.bool)
    full[full_heads] = True
    ref = reference(q, k, v, None, full, Pattern(5, 40), 0.25)
    out = blocked(q, k, v, None, full, Pattern(5, 40), 0.25, block=16, path=path)
    assert (out - ref).abs().max().item() <= 1e-5


def test_head_runs_cut_at_gaps():
    assert tiling.head_runs(torch.tensor([8, 11, 13, 14, 15])) == [(0, 1, 8), (1, 2, 11), (2, 5, 13)]
    assert tiling.head_runs(torch.tensor([3])) == [(0, 1, 3)]


def test_band_reads_strided_queries_and_keys_in_place():
    """The model's q, k, v are often transposed views (batch, n, heads, dim): rows strided, last dim contiguous."""
    g = torch.Generator().manual_seed(4)
    n, heads, kv, dim = 301, 6, 2, 16
    q = torch.randn(1, n, heads, dim, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, n, kv, dim, generator=g).transpose(1, 2) for _ in range(2))
    full = torch.tensor([False, True, False, False, False, True])
    ref = reference(q, k, v, None, full, Pattern(6, 40), 0.25)
    assert (blocked(q, k, v, None, full, Pattern(6, 40), 0.25, path="band") - ref).abs().max().item() <= 1e-5
    out = torch.zeros(n, heads, dim)
    with pytest.raises(RuntimeError, match="head index out of range"):  # checked, never read out of bounds
        band.attend(tiling.Group(q[0], torch.tensor([6]), k[0, 0], v[0, 0], out, Pattern(6, 40), 0.25))


def test_without_the_band_kernel_the_split_tiles_run(monkeypatch):
    """Where the C++ extension cannot be built, the default path is the split tiles; asking for it says why."""
    assert tiles.streaming_path(torch.device("cpu"), 1024) == "band"  # this machine builds it
    assert tiles.streaming_path(torch.device("cpu"), 1024, rows=tiles.BAND_MIN - 1) == "split"  # short prompt
    assert tiles.streaming_path(torch.device("meta"), 1024) == "masked"
    monkeypatch.setattr(band, "_STATE", {})
    monkeypatch.setenv("CORELENS_NATIVE", "0")
    assert band.module() is None and band.error() == "disabled by CORELENS_NATIVE=0"
    assert tiles.streaming_path(torch.device("cpu"), 1024) == "split"
    assert tiles.streaming_path(torch.device("cpu"), 1) == "masked"
    q, k, v, full = _inputs(1, 4, 2, 157, seed=2)
    with pytest.raises(RuntimeError, match="band kernel is unavailable: disabled by CORELENS_NATIVE=0"):
        blocked(q, k, v, None, full, Pattern(5, 40), 0.25, path="band")
    ref = reference(q, k, v, None, full, Pattern(5, 40), 0.25)
    assert (blocked(q, k, v, None, full, Pattern(5, 40), 0.25) - ref).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="unknown streaming path 'fast'"):
        blocked(q, k, v, None, full, Pattern(5, 40), 0.25, path="fast")


def test_split_tiles_apply_only_where_every_query_keeps_a_middle_key():
    assert split.split_block(1024) == split.SPLIT_BLOCK and split.split_block(40) == 40
    assert split.split_block(7, 8) is None and split.split_block(7, 1) is None  # B > W; B < 2
    assert split.split_block(1) is None
    edge = split.edge_rule(Pattern(2, 4), 4)  # 2 sinks, 3 left columns (c >= r), 3 right columns (c < r)
    assert edge.sum(dim=1).tolist() == [2 + 3] * 4  # every row: its sinks and B - 1 edge keys


@pytest.mark.parametrize("batch", [1, 2])  # one prompt of even length: the halves are views
@pytest.mark.parametrize("n", [256, 301, 512])
@pytest.mark.parametrize("heads", [1, 3])
def test_balanced_causal_equals_sdpa(n, heads, batch):
    """The thread-balanced split (diagonal halves + rectangle, merged by log-sum-exp) is causal sdpa."""
    q, k, v, _ = _inputs(batch, heads, 1, n, seed=n + heads)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    assert (causal_balanced(q, k, v, 0.3) - want).abs().max().item() <= 1e-5


def test_balance_pays_only_where_one_call_leaves_a_thread_idle(monkeypatch):
    """An odd head count on 2 threads leaves one thread the late query blocks: the split pays at long prompts."""
    assert causal.balance_pays(1, 16384, 2) and not causal.balance_pays(1, 16384, 1)
    assert causal.balance_pays(1, 4096, 2) and causal.balance_pays(3, 16384, 2)
    assert causal.balance_pays(5, 32768, 2)
    assert not causal.balance_pays(2, 16384, 2) and not causal.balance_pays(4, 32768, 2)
    assert not causal.balance_pays(3, 4096, 2)  # 17 % predicted, less than the split's cost at 4k
    # Forced on, the full heads of the blocked kernel still equal the dense reference.
    monkeypatch.setattr(causal, "balance_pays", lambda *args: True)
    q, k, v, _ = _inputs(1, 4, 2, 301, seed=5)
    for full in ([True, False, False, True], [True, True, False, False]):  # two KV heads; one, read in place
        full = torch.tensor(full)
        ref = reference(q, k, v, None, full, Pattern(8, 32), 0.25)
        assert (blocked(q, k, v, None, full, Pattern(8, 32), 0.25) - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("path", tiles.PATHS)
@pytest.mark.parametrize("groups", [1, 3])
def test_blocked_left_padding_and_other_masks(groups, path):
    n, sink, window = 211, 6, 50
    q, k, v, full = _inputs(3, 3 * groups, groups, n, seed=7)
    scale = 0.3
    mask = _left_padded([0, 9, 120], n)
    ref = reference(q, k, v, mask, full, Pattern(sink, window), scale)
    out = blocked(q, k, v, mask, full, Pattern(sink, window), scale, block=16, path=path)
    assert (out - ref).abs().max().item() <= 1e-5
    assert out[2, :120].abs().max() == 0  # pad rows attend nothing, as in sdpa
    assert torch.equal(row_starts(mask, 3, q.device), torch.tensor([0, 9, 120]))
    # Right padding / any mask that is not causal + left padding: the exact dense path.
    holes = mask & (torch.rand(3, 1, n, n, generator=torch.Generator().manual_seed(1)) < 0.9)
    ref = reference(q, k, v, holes, full, Pattern(sink, window), scale)
    assert (blocked(q, k, v, holes, full, Pattern(sink, window), scale) - ref).abs().max().item() <= 1e-5


def test_blocked_keeps_the_input_dtype_with_fp32_accumulation():
    q, k, v, full = _inputs(1, 4, 2, 300, seed=3, dtype=torch.bfloat16)
    out = blocked(q, k, v, None, full, Pattern(4, 32), 0.25)
    ref = reference(q.float(), k.float(), v.float(), None, full, Pattern(4, 32), 0.25)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max().item() <= 2e-2  # bf16 output rounding only


@pytest.mark.parametrize("pads", [None, [0, 40]])
def test_flex_equals_reference(pads):
    n = 197
    q, k, v, full = _inputs(2, 6, 3, n, seed=11)
    mask = None if pads is None else _left_padded(pads, n)
    ref = reference(q, k, v, mask, full, Pattern(5, 33), 0.25)
    out = flex(q, k, v, mask, full, Pattern(5, 33), 0.25, compiled=False)
    assert (out - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    "n,sink,window,block", [(100, 5, 16, 8), (97, 0, 20, 16), (64, 30, 3, 8), (130, 7, 1, 32)]
)
def test_flex_block_mask_classifies_tiles_exactly(n, sink, window, block):
    """Full tiles must hold only kept pairs (their mask_mod is skipped); every kept pair must be in a tile."""
    flags = (True, False, False)
    bm = policy_block_mask(flags, n, Pattern(sink, window), "cpu", block=block)
    mod = hybrid_mask_function(Pattern(sink, window), torch.tensor(flags))
    i = torch.arange(n)
    nb = -(-n // block)
    for h in range(len(flags)):
        dense = mod(0, h, i[:, None], i[None, :])
        tiles = torch.nn.functional.pad(dense, (0, nb * block - n, 0, nb * block - n))
        tiles = tiles.view(nb, block, nb, block).transpose(1, 2)
        partial = torch.zeros(nb, nb, dtype=torch.bool)
        whole = torch.zeros(nb, nb, dtype=torch.bool)
        for qb in range(nb):
            partial[qb, bm.kv_indices[0, h, qb, : bm.kv_num_blocks[0, h, qb]].long()] = True
            whole[qb, bm.full_kv_indices[0, h, qb, : bm.full_kv_num_blocks[0, h, qb]].long()] = True
        has_pair = tiles.any(dim=-1).any(dim=-1)
        assert not (partial & whole).any()
        assert torch.equal(has_pair, partial | whole)
        for qb, kb in whole.nonzero().tolist():
            rows = slice(qb * block, min(n, (qb + 1) * block))
            cols = slice(kb * block, min(n, (kb + 1) * block))
            assert dense[rows, cols].all()


def test_auto_prefers_partitioned_on_cuda_and_falls_back(monkeypatch):
    assert kernels.choose("auto", torch.device("cuda")) == "partitioned"
    assert kernels.choose("auto", torch.device("cpu")) == "blocked"
    assert kernels.choose("flex", torch.device("cuda")) == "flex"  # flex stays reachable by name
    with pytest.raises(ValueError, match="unknown hybrid kernel"):
        kernels.choose("fast", torch.device("cpu"))

    def broken(*args, **kwargs):
        raise RuntimeError("no triton here")

    # What a CUDA machine whose FlexAttention fails to compile goes through, simulated on CPU.
    monkeypatch.setattr(kernels, "choose", lambda kind, device: "flex")
    monkeypatch.setitem(kernels.IMPLEMENTATIONS, "flex", broken)
    q, k, v, full = _inputs(1, 4, 2, 90, seed=5)
    with pytest.warns(RuntimeWarning, match="flex failed .*no triton here.*; using blocked"):
        out, ran, reason = kernels.prefill("auto", q, k, v, None, full, Pattern(3, 20), 0.25)
    assert ran == "blocked" and "no triton here" in reason
    assert (out - reference(q, k, v, None, full, Pattern(3, 20), 0.25)).abs().max().item() <= 1e-5
    with pytest.raises(RuntimeError, match="no triton"):  # an explicit choice never falls back
        kernels.prefill("flex", q, k, v, None, full, Pattern(3, 20), 0.25)


def test_auto_on_cuda_runs_partitioned_with_its_crossover(monkeypatch):
    """`auto` on a CUDA tensor (the device simulated on CPU tensors) runs the partitioned kernel, and a head
    set below the crossover runs dense."""
    choose = kernels.choose
    monkeypatch.setattr(kernels, "choose", lambda kind, device: choose(kind, torch.device("cuda")))
    q, k, v, full = _inputs(1, 4, 2, 90, seed=6)
    full = torch.tensor([True, False, False, False])
    expected = reference(q, k, v, None, full, Pattern(3, 20), 0.25)
    out, ran, reason = kernels.prefill("auto", q, k, v, None, full, Pattern(3, 20), 0.25)
    assert (ran, reason) == ("partitioned", None)
    assert (out - expected).abs().max().item() <= 1e-5
    out, ran, _ = kernels.prefill("auto", q, k, v, None, full, Pattern(3, 20), 0.25, dense_below=100.0)
    assert ran == "dense"


def test_plans_scan_each_mask_object_once():
    """The padding of a mask is computed once per mask object (every layer of a forward passes the same one)."""
    plans = tiles.Plans()
    mask = _left_padded([0, 9, 120], 211)
    first = plans.get(mask, 3)
    assert first.left and first.starts == (0, 9, 120)
    assert plans.get(mask, 3) is first
    holes = mask & (torch.rand(3, 1, 211, 211, generator=torch.Generator().manual_seed(1)) < 0.9)
    assert not plans.get(holes, 3).left  # a new mask object: scanned again
    assert plans.get(mask.clone(), 3) == first and plans.get(mask.clone(), 3) is not first


def test_a_hybrid_session_scans_the_prompt_mask_once_per_forward(tiny_dir, monkeypatch):
    from helpers import hybrid

    import corelens

    scans = []
    of = tiles.Padding.of
    monkeypatch.setattr(tiles.Padding, "of", classmethod(lambda cls, *a: scans.append(1) or of(*a)))
    m = corelens.load(tiny_dir("qwen2_5_vl", heads=4, kv_heads=2))
    ids = torch.randint(20, 60, (2, 157), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :23] = 0
    with torch.no_grad(), hybrid(m, [(0, 1)], sink=5, window=21, kernel="blocked") as h:
        for _ in range(2):
            m.model(input_ids=ids, attention_mask=mask)
    assert h.stats["prefill:blocked"] == 2 * m.num_layers > 2 and len(scans) == 2
