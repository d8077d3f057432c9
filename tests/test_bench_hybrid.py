"""End-to-end check of the hybrid-attention benchmark at a tiny width (no timing assertions)."""

from __future__ import annotations

import json

import pytest

from corelens.bench import hybrid as bench
from corelens.bench.hybrid import fractions, paired, prefill_flops, run_hybrid_benchmark, table
from corelens.cli import main as cli_main

TINY = {"heads": 4, "kv_heads": 2, "hidden": 64, "intermediate": 96, "layers": 2}


@pytest.fixture(scope="module")
def result() -> dict:
    """Run kernels (no FlexAttention compile) and prefill once at N = 300 with S = 8, W = 32."""
    return run_hybrid_benchmark(
        300, [0.25, 0.5], sink=8, window=32, with_flex=False, prefill_keeps=[0.5], threads=1, **TINY
    )


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
        "| 0k | 50% "
    )
