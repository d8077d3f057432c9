"""The partitioned kernel (the CUDA design: sdpa full heads, window pass + sink pass merged by log-sum-exp).

Held to the mask rule written out literally in float64 (tight), to the dense `reference` kernel, and in
bfloat16 within bf16 rounding; exhaustively for short prompts, randomly for longer ones; GQA shapes.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from corelens.attention import kernels
from corelens.attention.kernels import Pattern, partitioned, reference
from corelens.attention.kernels import partition as part
from corelens.attention.kernels.masks import sink_pass_mask_function, window_mask_function

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def literal(q, k, v, pads, full, sink, window, scale):
    """The rule of docs/methods.md#hybrid written out, in float64: j <= i, j real, and (full, a sink, or recent)."""
    batch, heads, n, _ = q.shape
    groups = heads // k.shape[1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    out = torch.zeros(batch, n, heads, v.shape[-1], dtype=torch.float64)
    for b in range(batch):
        s = pads[b]
        dense = (j <= i) & (j >= s)
        stream = dense & ((j - s < sink) | (i - j < window))
        for h in range(heads):
            scores = q[b, h].double() @ k[b, h // groups].double().T * scale
            scores = scores.masked_fill(~(dense if full[h] else stream), float("-inf"))
            out[b, :, h] = torch.softmax(scores, -1).nan_to_num(0.0) @ v[b, h // groups].double()
    return out


def padded_mask(pads, n):
    """The model's boolean mask (batch, 1, n, n): causal, left padding of pads[b] tokens in row b."""
    real = torch.arange(n)[None, :] >= torch.tensor(pads)[:, None]
    return (torch.ones(n, n, dtype=torch.bool).tril()[None] & real[:, None, :])[:, None]


def inputs(batch, heads, kv_heads, n, dim=8, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(batch, h, n, dim, generator=g, dtype=torch.float64).to(dtype)
        for h in (heads, kv_heads, kv_heads)
    ]


def _short(n, pads, sink, window, flags):
    q, k, v = inputs(len(pads), len(flags), 2, n, seed=n)
    mask = None if not any(pads) else padded_mask(pads, n)
    out = partitioned(q, k, v, mask, torch.tensor(flags), Pattern(sink, window), 0.5)
    return (out - literal(q, k, v, pads, flags, sink, window, 0.5)).abs().max().item()


@pytest.mark.e2e
def test_every_short_prompt_equals_the_rule():
    """Every n < 15 with S and W on either side of each other and of n, unpadded and left-padded."""
    flags = (True, False, False, False)  # a full head and a GQA pair of streaming heads
    worst = max(
        _short(n, pads, sink, window, flags)
        for n in range(1, 15)
        for sink, window in ((1, 2), (3, 4))
        for pads in ([0], [n // 2, 0])
    )
    assert worst <= 1e-12


def test_every_head_assignment_equals_the_rule():
    """All 16 full / streaming assignments of 4 query heads over 2 KV heads."""
    worst = max(
        _short(13, pads, 2, 3, flags)
        for flags in itertools.product((False, True), repeat=4)
        for pads in ([0],)
    )
    assert worst <= 1e-12


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(
    "n,sink,window,heads,kv_heads", [(157, 5, 40, 8, 2), (517, 0, 33, 6, 6), (1100, 128, 256, 7, 1)]
)
def test_long_prompts_equal_the_rule_and_the_reference(n, sink, window, heads, kv_heads, padded):
    q, k, v = inputs(2, heads, kv_heads, n, seed=n)
    g = torch.Generator().manual_seed(n + heads)
    full = torch.rand(heads, generator=g) < 0.3
    pads = [0, int(torch.randint(1, n // 2, (1,), generator=g))] if padded else [0, 0]
    mask = padded_mask(pads, n) if padded else None
    pattern = Pattern(sink, window)
    out = partitioned(q, k, v, mask, full, pattern, 0.3)
    assert (out - literal(q, k, v, pads, full.tolist(), sink, window, 0.3)).abs().max().item() <= 1e-12
    ref = reference(q.float(), k.float(), v.float(), mask, full, pattern, 0.3)
    assert (out.float() - ref).abs().max().item() <= 1e-5  # the dense reference kernel computes in fp32


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_bfloat16_within_bf16_rounding(kv_heads):
    q, k, v = inputs(1, 8, kv_heads, 400, dim=16, seed=3, dtype=torch.bfloat16)
    full = torch.tensor([True, False, False, True, False, False, False, False])
    out = partitioned(q, k, v, None, full, Pattern(8, 64), 0.25)
    assert out.dtype == torch.bfloat16 and out.shape == (1, 400, 8, 16)
    want = literal(q, k, v, [0], full.tolist(), 8, 64, 0.25)
    assert (out.double() - want).abs().max().item() <= 2e-2


def test_the_models_strided_views_are_read_as_they_are():
    """The model passes transposed views (batch, n, heads, dim) -> (batch, heads, n, dim)."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 301, 8, 16, generator=g, dtype=torch.float64).transpose(1, 2)
    k, v = (torch.randn(1, 301, 2, 16, generator=g, dtype=torch.float64).transpose(1, 2) for _ in range(2))
    full = torch.tensor([False, True, True, False, False, False, False, True])
    out = partitioned(q, k, v, None, full, Pattern(6, 40), 0.25)
    assert (out - literal(q, k, v, [0], full.tolist(), 6, 40, 0.25)).abs().max().item() <= 1e-12


def test_head_layout_groups_heads_by_kv_head_and_reads_runs_in_place():
    # 8 query heads over 2 KV heads: KV head 0 owns 0-3, KV head 1 owns 4-7.
    full_calls, stream_calls = part.layout((True, True, True, True, False, True, False, False), 2, "cpu")
    assert [(c.q.tolist(), c.kv.tolist(), c.members) for c in full_calls] == [
        ([5], [1], 1),
        ([0, 1, 2, 3], [0], 4),
    ]
    assert full_calls[1].q_run == (0, 4) and full_calls[1].kv_run == (0, 1)
    assert [(c.q.tolist(), c.kv.tolist(), c.members) for c in stream_calls] == [([4, 6, 7], [1], 3)]
    assert stream_calls[0].q_run is None  # not consecutive: gathered
    # KV-granular sets (whole groups) give one call per pass, each a view of consecutive heads.
    full_calls, stream_calls = part.layout((False,) * 4 + (True,) * 4, 2, "cpu")
    assert len(full_calls) == len(stream_calls) == 1 and full_calls[0].q_run == (4, 8)
    assert part.layout((False,) * 4 + (True,) * 4, 2, "cpu") is part.layout(
        (False,) * 4 + (True,) * 4, 2, "cpu"
    )


def test_the_two_passes_cover_the_rule_exactly_once():
    """window pass | sink pass (queries shifted by W) == the streaming rule, and they never overlap."""
    from corelens.attention.kernels.masks import streaming_mask_function

    for sink, window in itertools.product(range(5), range(1, 7)):
        p, n = Pattern(sink, window), 20
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        rule = streaming_mask_function(p)(0, 0, i, j)
        win = window_mask_function(p)(0, 0, i, j)
        sinks = torch.zeros(n, n, dtype=torch.bool)
        sinks[window:] = sink_pass_mask_function(p)(0, 0, torch.arange(n - window)[:, None], j)
        assert torch.equal(win | sinks, rule) and not (win & sinks).any()
        assert not sinks[:, sink:].any()  # the sink pass reads only the first S keys


def test_block_masks_are_built_once_per_length_not_per_layer(tiny_dir):
    from helpers import hybrid

    import corelens

    part.window_block_mask.cache_clear()
    part.sink_block_mask.cache_clear()
    m = corelens.load(tiny_dir("qwen2_5_vl", heads=4, kv_heads=2))
    ids = torch.randint(20, 60, (1, 157), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), hybrid(m, [(0, 1)], sink=5, window=21, kernel="partitioned") as h:
        out = m.model(input_ids=ids).logits
    assert h.stats["prefill:partitioned"] == m.num_layers > 1
    assert part.window_block_mask.cache_info().misses == 1 and part.window_block_mask.cache_info().hits >= 1
    with torch.no_grad(), hybrid(m, [(0, 1)], sink=5, window=21, kernel="reference"):
        want = m.model(input_ids=ids).logits
    assert (out - want).abs().max().item() <= 1e-4


def test_crossover_runs_dense_where_the_head_set_gains_too_little():
    q, k, v = inputs(1, 4, 2, 200, seed=1)
    pattern = Pattern(4, 16)
    many = torch.tensor([True, True, True, False])  # ideal speed-up 1.3x
    assert part.takes_dense(200, many, pattern, 1.5) and not part.takes_dense(200, many, pattern, 1.2)
    assert not part.takes_dense(200, many, pattern, None) and not part.takes_dense(20, many, pattern, 9.0)
    out, ran, reason = kernels.prefill("partitioned", q, k, v, None, many, pattern, 0.3, dense_below=1.5)
    assert ran == "dense" and reason is None
    causal = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3
    )
    assert (out - causal.transpose(1, 2)).abs().max().item() <= 1e-12
    out, ran, _ = kernels.prefill("partitioned", q, k, v, None, many, pattern, 0.3, dense_below=None)
    assert ran == "partitioned"
    assert (out - literal(q, k, v, [0], many.tolist(), 4, 16, 0.3)).abs().max().item() <= 1e-12


def test_other_masks_take_the_exact_dense_path():
    n = 90
    q, k, v = inputs(2, 4, 2, n, seed=2)
    holes = padded_mask([0, 7], n) & (
        torch.rand(2, 1, n, n, generator=torch.Generator().manual_seed(1)) < 0.9
    )
    full = torch.tensor([True, False, False, False])
    want = reference(q, k, v, holes, full, Pattern(3, 10), 0.3)
    assert (partitioned(q, k, v, holes, full, Pattern(3, 10), 0.3) - want).abs().max().item() <= 1e-6


def test_bench_hybrid_times_the_chosen_kernel(monkeypatch, capsys):
    """`corelens bench hybrid --kernel partitioned` reaches the benchmark; an unknown kernel is one error line."""
    from corelens.bench import hybrid_kernels as bench
    from corelens.cli import main as cli_main

    seen = {}
    monkeypatch.setattr(bench, "run_hybrid_benchmark", lambda tokens, keeps, **kw: seen.update(kw) or {})
    monkeypatch.setattr(bench, "summary", lambda result: "ok")
    assert cli_main(["bench", "hybrid", "--tokens", "300", "--kernel", "partitioned"]) == 0
    assert seen["kernel"] == "partitioned"
    assert cli_main(["bench", "hybrid", "--tokens", "300", "--kernel", "fast"]) == 2
    assert "argument --kernel: invalid choice: 'fast'" in capsys.readouterr().err


def test_bench_kernel_times_plan_and_backend_on_model_layout():
    from corelens.bench.hybrid_kernels import kernel_times

    out = kernel_times(300, [0.25], heads=4, kv_heads=2, head_dim=8, sink=4, window=32, repeats=1, seed=0,
                       with_flex=False, kernel="partitioned")  # fmt: skip
    assert out["hybrid_kernel"] == {"0.25": "partitioned"} and out["kernel"] == "partitioned"
    assert set(out["plan_build_s"]) == {"flex", "partitioned"}
    assert "scaled_dot_product" in out["sdpa_backend"]


def test_bench_kernel_choices_are_the_kernels():
    from corelens.attention.kernels import KERNELS
    from corelens.cli import parser

    bench = next(a for a in parser()._subparsers._group_actions[0].choices["bench"]._actions if a.choices)
    hybrid = bench.choices["hybrid"]
    kernel = next(a for a in hybrid._actions if a.dest == "kernel")
    assert tuple(kernel.choices) == KERNELS


def test_scattered_head_sets_split_into_runs_once_per_head_set():
    # 16 query heads over 4 KV heads (0-3, 4-7, 8-11, 12-15). Full: KV heads 0, 1, 3 whole, and 8.
    flags = (True,) * 8 + (True, False, False, False) + (True,) * 4
    full_calls, stream_calls = part.layout(flags, 4, "cpu")
    whole = next(c for c in full_calls if c.members == 4)
    assert whole.q_run is None  # heads 0-7, 12-15: not one run ...
    assert whole.runs == (part.Run(0, 8, 0, 2, 4), part.Run(12, 16, 3, 4, 4))  # ... but two, KV heads merged
    assert [c.runs for c in stream_calls] == [()] and stream_calls[0].q_run == (9, 12)
    assert part.layout(flags, 4, "cpu") is part.layout(flags, 4, "cpu")  # computed once per head set


class _Copies:
    """Counts the head copies of the partitioned kernel (`index_select`, `index_copy_`) while active."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for owner, name in (
            (torch.Tensor, "index_select"),
            (torch.Tensor, "index_copy_"),
            (torch, "index_select"),
        ):
            monkeypatch.setattr(owner, name, self._counted(getattr(owner, name)))

    def _counted(self, fn):
        def counted(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)

        return counted


@pytest.mark.parametrize("pads", [[0], [0, 37]])
def test_scattered_sets_of_runs_copy_no_head(monkeypatch, pads):
    """A scattered set made of contiguous runs is read as views (GQA members over their KV head, unrepeated)
    and written in slices: no index_select / index_copy_; the output equals the rule."""
    flags = [True, True, False, False, True, False, False, True]  # full runs 0-1, 4, 7; streaming 2-3, 5-6
    q, k, v = inputs(len(pads), 8, 2, 190, seed=11)
    mask = padded_mask(pads, 190) if any(pads) else None
    copies = _Copies(monkeypatch)
    out = partitioned(q, k, v, mask, torch.tensor(flags), Pattern(5, 30), 0.3)
    assert copies.calls == 0
    assert (out - literal(q, k, v, pads, flags, 5, 30, 0.3)).abs().max().item() <= 1e-12


def test_heads_scattered_one_by_one_are_gathered_and_exact(monkeypatch):
    """Past `MAX_RUNS` runs a call gathers its heads (one copy) instead of many small calls; still the rule."""
    flags = [h % 2 == 0 for h in range(32)]  # 16 runs of one head per pass over 4 KV heads
    full_calls, stream_calls = part.layout(tuple(flags), 4, "cpu")
    assert all(c.runs == () and c.q_run is None for c in full_calls + stream_calls)
    q, k, v = inputs(1, 32, 4, 120, dim=4, seed=12)
    copies = _Copies(monkeypatch)
    out = partitioned(q, k, v, None, torch.tensor(flags), Pattern(3, 25), 0.4)
    assert copies.calls > 0
    assert (out - literal(q, k, v, [0], flags, 3, 25, 0.4)).abs().max().item() <= 1e-12


@pytest.mark.parametrize(
    "flags",
    [
        (True, False, False, True, True, True, False, False),  # query-granular, scattered over KV heads
        (False, False, True, True, False, False, True, True),  # KV-granular: KV heads 1 and 3, whole
        (True, True, False, False, False, False, False, False),  # KV head 0, consecutive: views
        (False,) * 8,
        (False, False, False, False, False, True, False, False),
    ],
)
@pytest.mark.parametrize("pads", [[0, 0], [0, 7]])
def test_full_heads_run_in_one_sdpa_call(flags, pads, monkeypatch):
    """`full_call="one"`: every full head of a row in one sdpa call, query- or KV-granular, equal to the rule."""
    calls = []
    run = part._full

    def counted(q, k, v, scale, members):
        calls.append((q.shape[1], k.shape[1], members))
        return run(q, k, v, scale, members)

    monkeypatch.setattr(part, "_full", counted)
    q, k, v = inputs(2, 8, 4, 45, seed=sum(flags) + pads[1])
    mask = padded_mask(pads, 45) if any(pads) else None
    out = partitioned(q, k, v, mask, torch.tensor(flags), Pattern(3, 7), 0.5, stream="flex", full_call="one")
    assert (out - literal(q, k, v, pads, flags, 3, 7, 0.5)).abs().max().item() <= 1e-12
    rows = 2 if any(pads) else 1  # a padded batch runs row by row
    assert len(calls) == (rows if any(flags) else 0)
    if calls:
        whole = flags == (False, False, True, True, False, False, True, True) or flags[:2] == (True, True)
        assert calls[0] == (sum(flags), sum(flags) // 2 if whole else sum(flags), 2 if whole else 1)
