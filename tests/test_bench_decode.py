"""The decoding benchmark at a tiny width (no timing assertions): its policy, its byte counts, its command."""

from __future__ import annotations

import json

import pytest

from corelens.bench.decode import full_heads, run_decode_benchmark
from corelens.cli import main as cli_main

TINY = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 256, "sink": 4, "window": 16}


def test_kv_granular_policy_keeps_whole_groups():
    pairs = full_heads(4, 8, 2, 0.25, "kv", seed=1)  # 2 of the 8 KV heads, 4 query heads each
    assert len(pairs) == 8
    groups = {(layer, head // 4) for layer, head in pairs}
    assert len(groups) == 2 and all((layer, g * 4 + i) in pairs for layer, g in groups for i in range(4))
    assert len(full_heads(4, 8, 2, 0.25, "query", seed=1)) == 8  # 8 of the 32 query heads
    assert full_heads(4, 8, 2, 0.25, "kv", seed=1) == pairs  # seeded


@pytest.fixture(scope="module")
def result() -> dict:
    return run_decode_benchmark(100, keep=0.25, steps=5, repeats=1, **TINY)


def test_decode_benchmark_counts_the_trimmed_cache(result):
    # 1 of the 4 KV heads full: the other 3 keep S + W = 20 of 105 positions (+ their slot table).
    assert result["trimmed_kv_heads"] == 3 and result["full_query_heads"] == 2
    assert result["hybrid_stats"]["trimmed"] == 5 * 2  # every decoding step of both layers ran trimmed
    assert result["hybrid_dense_equivalent_bytes"] == result["dense_kv_bytes"]  # the same positions
    per_head = 105 * 32 * 2 * 4  # 100 + 5 positions x (K + V) x head dim 32 x fp32
    slots = 2 * 20 * 8  # two trimmed layers' slot tables (int64)
    assert result["dense_kv_bytes"] == 4 * per_head
    assert result["hybrid_kv_bytes"] == per_head + 3 * 20 * 32 * 2 * 4 + slots
    assert result["dense_tokens_per_s"] > 0 and result["hybrid_tokens_per_s"] > 0


def test_decode_benchmark_states_the_asked_and_effective_shares(result):
    """F = 25 % of the KV heads asked: 1 of 4 KV heads full, its 2 query heads of 8 full (both 0.25)."""
    from corelens.bench.decode import summary

    assert result["keep"] == 0.25 and result["granularity"] == "kv"
    assert result["full_fraction"] == 2 / 8 and result["kv_full_fraction"] == 1 / 4
    assert "F=25% (kv; query heads full 0.250, KV heads full 0.250)" in summary(result)


def test_decode_command_writes_json(tmp_path, capsys):
    path = tmp_path / "decode.json"
    args = ["bench", "decode", "--tokens", "40", "--steps", "2", "--repeats", "1", "--keep", "50%",
            "--granularity", "query", "--json", str(path)]  # fmt: skip
    for name, value in TINY.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    assert cli_main(args) == 0
    data = json.loads(path.read_text())
    assert data["granularity"] == "query" and data["full_query_heads"] == 4
    assert "decode bench N=40" in capsys.readouterr().out
    assert cli_main(["bench", "decode", "--tokens", "40", "--keep", "3"]) == 2  # a count, not a share
    assert "argument --keep: expected shares of the heads" in capsys.readouterr().err


def test_decode_benchmark_pins_one_sdpa_backend_for_both_sides(result):
    assert result["sdpa_backends_pinned"] == ["FLASH_ATTENTION", "MATH"]
    dense = set(result["sdpa_backend"]["dense"].split(", "))
    assert dense and dense <= set(result["sdpa_backend"]["hybrid"].split(", "))  # the full heads' own call


def test_decode_benchmark_refuses_two_backends(monkeypatch):
    from corelens.bench import hybrid_kernels
    from corelens.errors import CorelensError

    ops = iter(["aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention"])
    monkeypatch.setattr(hybrid_kernels, "sdpa_backend", lambda fn: (fn(), next(ops))[1])
    with pytest.raises(CorelensError, match="needs one backend for both"):
        run_decode_benchmark(60, keep=0.25, steps=2, repeats=1, **TINY)
