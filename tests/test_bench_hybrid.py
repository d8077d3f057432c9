"""End-to-end check of the hybrid-attention benchmark at a tiny width (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch

from corelens.bench import hybrid_kernels as bench
from corelens.bench.hybrid_kernels import fractions, paired, prefill_flops, run_hybrid_benchmark, table
from corelens.cli import main as cli_main

TINY = {"heads": 4, "kv_heads": 2, "hidden": 64, "intermediate": 96, "layers": 2}


@pytest.fixture(scope="module")
def result() -> dict:
    """Run kernels (no FlexAttention compile) and prefill once at N = 300 with S = 8, W = 32, the prefill with
    query- and KV-granular head sets."""
    return run_hybrid_benchmark(
        300, [0.25, 0.5], sink=8, window=32, with_flex=False, prefill_keeps=[0.5], threads=1,
        prefill_granularities=["query", "kv"], **TINY,
    )  # fmt: skip


def test_result_has_the_issue_keys_and_consistent_ratios(result: dict) -> None:
    """The JSON names sdpa/hybrid/flex/prefill times; speed-ups are the ratios of the times it holds."""
    for key in ("sdpa_s", "hybrid_s", "flex_s", "ideal_speedup", "prefill_sdpa_s", "prefill_hybrid_s"):
        assert key in result
    assert result["flex_s"] is None and "flex_error" not in result  # not asked for: no number, no error
    assert result["device"] == "cpu" and result["dtype"] == "float32"
    assert result["hybrid_kernel"] == {"0.25": "blocked", "0.5": "blocked"}  # `auto` on the CPU
    assert result["streaming_path"] == "split"  # 260 positions past the prefix: too short to build the band
    assert set(result["per_keep"]) == {"0.25", "0.5"} and set(result["prefill_per_keep"]) == {"0.5"}
    times = result["times_s"]
    for keep, row in result["per_keep"].items():
        assert row["hybrid_s"] > 0
        assert row["speedup"] == pytest.approx(paired(times["sdpa"], times[f"hybrid:{keep}"]))
        assert row["speedup"] == pytest.approx(result["sdpa_s"] / row["hybrid_s"])  # one repeat
        assert row["of_ideal"] == pytest.approx(row["speedup"] / row["ideal_speedup"])
    pre = result["prefill_per_keep"]["0.5"]
    assert pre["full_heads"] == 4 and pre["full_fraction"] == 0.5  # round(0.5 * 2 layers * 4 heads)
    assert pre["prefill_speedup"] == pytest.approx(result["prefill_sdpa_s"] / pre["prefill_hybrid_s"])
    assert pre["kernels_ran"]  # the hybrid kernels really ran in the prefill
    # 300 tokens > S + W: streaming KV heads keep S + W of 300 positions.
    assert pre["cache_saved_bytes"] == pre["streaming_kv_heads"] * ((300 - 40) * 16 * 2 * 4 - 40 * 8)
    json.dumps(result)
    lines = table([result]).splitlines()
    assert len(lines) == 2 + 2 and lines[2].count("—") >= 5  # no prefill at 25 %: dashes, no made-up numbers


def test_ratios_are_medians_of_ratios_within_a_repeat() -> None:
    """A slow spell in one repeat slows both of its sides: the paired median ignores it, medians do not."""
    sdpa, hybrid = [8.0, 12.0, 8.4], [2.0, 3.0, 2.8]  # repeat 2 ran slow on both sides
    assert paired(sdpa, hybrid) == pytest.approx(4.0)  # ratios 4, 4, 3
    assert paired([1.0, 2.0, 9.0], [1.0, 1.0, 3.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        paired([1.0, 2.0], [1.0])


def test_prefill_flops_count_projections_mlp_and_attention_pairs() -> None:
    """Dense FLOPs are projections + MLP + every causal pair; W >= N makes the hybrid count equal."""
    n, hidden, heads, kv, inter = 100, 64, 4, 2, 96
    head_dim = hidden // heads
    dense = prefill_flops(n, layers=1, hidden=hidden, heads=heads, kv_heads=kv, intermediate=inter,
                          full_heads=None, sink=4, window=10)  # fmt: skip
    want = 2 * n * hidden * (2 * hidden + 2 * kv * head_dim) + 6 * n * hidden * inter
    want += 4 * head_dim * heads * n * (n + 1) // 2
    assert dense == want
    wide = prefill_flops(n, layers=1, hidden=hidden, heads=heads, kv_heads=kv, intermediate=inter,
                         full_heads=0, sink=4, window=n)  # fmt: skip
    assert wide == dense
    narrow = prefill_flops(n, layers=1, hidden=hidden, heads=heads, kv_heads=kv, intermediate=inter,
                           full_heads=0, sink=4, window=10)  # fmt: skip
    assert narrow < dense


def test_main_parses_fractions_and_prefill_subset(monkeypatch, tmp_path, result: dict) -> None:
    """`--keep 5%,0.2 --prefill-keep 20%` reaches the benchmark as fractions; the JSON is written."""
    assert fractions("5%,0.2, 50%") == [0.05, 0.2, 0.5]
    seen = {}

    def fake(tokens: int, keeps: list[float], **kwargs) -> dict:
        seen.update(kwargs, tokens=tokens, keeps=keeps)
        return result

    monkeypatch.setattr(bench, "run_hybrid_benchmark", fake)
    path = tmp_path / "h.json"
    argv = ["--tokens", "300", "--keep", "5%,0.2", "--prefill-keep", "20%", "--no-flex", "--json", str(path)]
    assert cli_main(["bench", "hybrid", *argv, "--device", "cuda:1", "--dtype", "bfloat16"]) == 0
    assert seen["keeps"] == [0.05, 0.2] and seen["prefill_keeps"] == [0.2] and seen["with_flex"] is False
    assert seen["device"] == "cuda:1" and seen["dtype"] == "bfloat16"
    assert json.loads(path.read_text())["tokens"] == 300


def test_adaptive_prefill_is_timed_against_the_fixed_set_at_its_per_layer_counts() -> None:
    """`adaptive=True` adds the per-prompt choice at the fixed set's counts; its ratios are paired like the rest."""
    got = run_hybrid_benchmark(
        300, [0.5], sink=8, window=32, with_flex=False, threads=1, repeats=2, adaptive=True, seed=3, **TINY
    )
    pre = got["prefill_per_keep"]["0.5"]
    times = got["prefill_times_s"]
    assert pre["adaptive_speedup"] == pytest.approx(paired(times["sdpa"], times["adaptive:0.5"]))
    assert pre["adaptive_over_fixed"] == pytest.approx(paired(times["adaptive:0.5"], times["hybrid:0.5"]))
    # Layers whose count is neither 0 nor all 4 heads measure the signal: one per layer of the fixed set's split.
    full = bench.choose_full(8, 0.5, 3)
    counts = [sum(1 for i in full if i // 4 == layer) for layer in range(2)]
    choosing = sum(1 for c in counts if 0 < c < 4)
    assert choosing > 0 and pre["adaptive_signal_layers"] == choosing
    assert pre["selection_scores_fraction"] == pytest.approx(choosing * 16 * 300 / (2 * 300 * 301 / 2))
    assert pre["adaptive_kernels_ran"].get("prefill:blocked", 0) == 2  # it streamed in both layers
    lines = table([got]).splitlines()
    assert lines[-3].startswith("| N | F | prefill sdpa s | fixed s | adaptive s") and lines[-1].startswith(
        "| 300 | 50% "
    )


def test_prefill_at_both_granularities_states_asked_and_effective_shares(result: dict) -> None:
    """`prefill_granularities` times a query- and a KV-granular head set at each share; every row states the
    asked share, the query and KV heads full and the KV-cache bytes kept, in the JSON, summary and table."""
    assert result["prefill_granularities"] == ["query", "kv"]
    by = result["prefill_by_granularity"]
    assert result["prefill_per_keep"] is by["query"]  # the kernel table's granularity
    query, kv = by["query"]["0.5"], by["kv"]["0.5"]
    assert query["asked_share"] == kv["asked_share"] == 0.5
    # KV-granular: 2 of 4 KV heads (2 layers x 2), all their query heads full; nothing else full.
    assert kv["granularity"] == "kv" and kv["full_heads"] == 4 and kv["streaming_kv_heads"] == 2
    assert kv["full_fraction"] == kv["kv_full_fraction"] == 0.5
    # Query-granular: 4 of 8 query heads; a KV head stays whole unless all its query heads stream.
    assert query["full_heads"] == 4 and query["kv_full_fraction"] >= 0.5
    for row in (query, kv):
        saved = row["streaming_kv_heads"] * ((300 - 40) * 16 * 2 * 4 - 40 * 8)
        assert row["cache_kept_fraction"] == pytest.approx(1 - saved / row["cache_dense_bytes"])
        assert row["prefill_speedup"] > 0 and row["kernels_ran"]
    times = result["prefill_times_s"]
    assert set(times) == {"sdpa", "hybrid:0.5", "hybrid:kv:0.5"} and all(len(t) == 1 for t in times.values())
    assert kv["prefill_speedup"] == pytest.approx(result["prefill_sdpa_s"] / kv["prefill_hybrid_s"])
    text = bench.summary(result)
    assert "prefill kv F=0.5: query heads full 0.500, KV heads full 0.500" in text
    lines = bench.prefill_table([result]).splitlines()
    assert lines[0].startswith(
        "| N | granularity | F asked | query heads full | KV heads full | KV-cache bytes"
    )
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 300", "| 300"]  # under 1k: N as it is
    assert [line.split(" | ")[1:6] for line in lines[2:]] == [
        ["kv", "50%", "0.500", "0.500", f"{kv['cache_kept_fraction']:.3f}"],
        ["query", "50%", "0.500", f"{query['kv_full_fraction']:.3f}", f"{query['cache_kept_fraction']:.3f}"],
    ]
    assert bench.prefill_table([{**result, "prefill_by_granularity": {}}]) == ""  # an older result: no table


def test_attention_inside_the_model_is_held_against_the_kernel_time_per_layer(result: dict) -> None:
    """Each layer's registered attention call, timed in the model's forward, against the benchmark's time of
    the same head set at the same N; stock sdpa likewise; compile frames of the timed repeats counted."""
    for row in result["prefill_by_granularity"]["kv"].values():
        assert set(row["attention_in_model_s"]) == set(row["attention_kernel_s"]) == {"0", "1"}
        for layer, ratio in row["in_model_over_kernel"].items():
            assert row["attention_in_model_s"][layer] > 0
            assert ratio == pytest.approx(
                row["attention_in_model_s"][layer] / row["attention_kernel_s"][layer]
            )
        assert row["in_model_over_kernel_max"] == max(row["in_model_over_kernel"].values())
    sdpa = result["sdpa_in_model_over_kernel"]
    assert set(sdpa) == {"0", "1"}
    assert sdpa["0"] == pytest.approx(result["sdpa_attention_in_model_s"]["0"] / result["sdpa_kernel_s"])
    assert result["compiles_timed"] == 0 and result["prefill_compiles_timed"] == 0  # nothing compiles on CPU
    assert "torch.compile frames compiled during the timed repeats: kernels 0, prefill 0" in bench.summary(
        result
    )
    assert "| attention in model / kernel: L0 " in bench.summary(result)
    # The full heads of the hybrid kernel ran an sdpa operator, and the summary names it beside the baseline's.
    assert "scaled_dot_product" in result["hybrid_sdpa_backend"]
    assert f"full heads at F=0.5: {result['hybrid_sdpa_backend']}" in bench.summary(result)


def test_attention_timer_times_each_layer_and_unwraps_after_the_block() -> None:
    """Inside `timing()` every registered call of a layer is timed (here by a clock that ticks 1 s per
    reading: one second per call); after the block the registered functions are the originals again."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # What is registered before the block, not transformers' own function: importing kvpress (another test in
    # this process) wraps the global "sdpa" registration.
    registered, local = ALL_ATTENTION_FUNCTIONS["sdpa"], "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping

    model = bench.build_model(layers=3, hidden=32, heads=4, kv_heads=2, intermediate=48)
    ids = bench.make_input_ids(24)
    clock = iter(range(10**6))
    timer = bench.AttentionTimer(bench.CPU)
    # This timer's own clock: patching time.perf_counter would also tick for other threads of the process.
    timer.clock = lambda: float(next(clock))
    with torch.no_grad(), timer.timing(("sdpa",)):
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not registered
        model(input_ids=ids)
        model(input_ids=ids)
        assert timer.collect() == {0: 2.0, 1: 2.0, 2: 2.0}  # two forwards, one call per layer each
        assert timer.collect() == {}
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is registered
    assert ("sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping) == local
    with torch.no_grad():
        model(input_ids=ids)
    assert timer.collect() == {}  # outside the block nothing is timed


def test_prefill_counts_compiles_of_its_timed_repeats_and_holds_each_layer_to_its_own_heads(
    monkeypatch,
) -> None:
    """`compiles()` grows with each frame torch.compile compiles (not with a cached call); the prefill reports
    the difference across its timed repeats, and each layer's in-model time is held against the kernel time of
    that layer's own head set."""
    fn = torch.compile(lambda x: x * 2 + 1, backend="eager")
    before = bench.compiles()
    fn(torch.ones(3))
    compiled = bench.compiles()
    assert compiled > before
    fn(torch.ones(3))
    assert bench.compiles() == compiled  # same shape: nothing recompiled
    fn(torch.ones(3, 2))
    assert bench.compiles() > compiled  # a new rank: compiled again
    readings = iter([5, 7])
    monkeypatch.setattr(bench, "compiles", lambda: next(readings))
    # Each head set's kernel time, as a number that names the set: the rows must hold each layer's own.
    sets = []

    def kernel_seconds(tokens, flags, **kw):
        sets.extend(flags)
        return 1.0, {f: 100.0 + sum(2**i for i, full in enumerate(f) if full) for f in flags}

    monkeypatch.setattr(bench, "layer_kernel_seconds", kernel_seconds)
    got = bench.prefill_times(80, [0.5], layers=3, hidden=32, heads=4, kv_heads=2, intermediate=48, sink=4,
                              window=16, repeats=1, seed=0, granularities=["query", "kv"])  # fmt: skip
    assert got["prefill_compiles_timed"] == 2 and got["prefill_warm_tokens"] == 80  # CPU: min(N, 256)
    assert got["sdpa_kernel_s"] == 1.0
    for g, group in (("query", 1), ("kv", 2)):
        full = bench.choose_full(12, 0.5, 0, group)
        want = {str(layer): 100.0 + sum(2 ** (i % 4) for i in full if i // 4 == layer) for layer in range(3)}
        assert got["prefill_by_granularity"][g]["0.5"]["attention_kernel_s"] == want
    assert len(sets) == len(set(sets)) >= 3  # each distinct head set timed once


def test_prefill_granularity_option_reaches_the_benchmark(monkeypatch, capsys, result: dict) -> None:
    """`--prefill-granularity query,kv` reaches the benchmark as a list; a wrong name is one error line."""
    seen = {}
    monkeypatch.setattr(bench, "run_hybrid_benchmark", lambda tokens, keeps, **kw: seen.update(kw) or result)
    assert cli_main(["bench", "hybrid", "--tokens", "300", "--prefill-granularity", "query,kv"]) == 0
    assert seen["prefill_granularities"] == ["query", "kv"]
    assert cli_main(["bench", "hybrid", "--tokens", "300"]) == 0 and seen["prefill_granularities"] is None
    capsys.readouterr()
    assert cli_main(["bench", "hybrid", "--tokens", "300", "--prefill-granularity", "query,head"]) == 2
    err = capsys.readouterr().err
    assert "--prefill-granularity" in err and "expected query, kv or query,kv" in err
