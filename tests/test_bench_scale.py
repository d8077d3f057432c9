"""`corelens bench scale` runs end to end on a small shape (the timings themselves are never asserted)."""

from __future__ import annotations

import json

import pytest

from corelens.cli import main as cli

pytestmark = pytest.mark.e2e  # whole workflows: `make check` leaves this file out


def test_bench_scale_runs_both_sides_at_each_size_and_checks_identical_heads(tmp_path, capsys):
    out = tmp_path / "scale.json"
    small = ["--samples", "3,5", "--repeats", "1", "--layers", "1", "--hidden", "128", "--heads", "4",
             "--kv-heads", "2", "--head-dim", "32", "--intermediate", "256", "--task", "image"]  # fmt: skip
    assert cli(["bench", "scale", *small, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"]["hidden"] == 128 and [s["samples"] for s in result["sizes"]] == [3, 5]
    for size in result["sizes"]:
        assert size["heads_identical"]
        runs = size["one_rank"] + size["two_ranks"]
        assert [sum(r["samples_per_rank"]) for r in runs] == [size["samples"]] * 2
        assert len(size["two_ranks"][0]["samples_per_rank"]) == 2
        assert all(r["wall_s"] > r["loop_s"] > 0 for r in runs)
    assert result["wall_ratio"] == result["sizes"][-1]["wall_ratio"] and result["overhead"]["ratio"] > 0
    out = capsys.readouterr().out
    assert "    3 samples: 1 rank" in out and "    5 samples: 1 rank" in out
