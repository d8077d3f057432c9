"""`corelens bench scale` runs end to end on a small shape (the timings themselves are never asserted)."""

from __future__ import annotations

import json

from corelens.bench.scale import main


def test_bench_scale_runs_both_sides_and_checks_identical_heads(tmp_path, capsys):
    out = tmp_path / "scale.json"
    small = ["--samples", "3", "--repeats", "1", "--layers", "1", "--hidden", "128", "--heads", "4",
             "--kv-heads", "2", "--head-dim", "32", "--intermediate", "256", "--task", "image"]  # fmt: skip
    assert main([*small, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["heads_identical"] and result["model"]["hidden"] == 128
    assert [sum(r["samples_per_rank"]) for r in result["one_rank"] + result["two_ranks"]] == [3, 3]
    assert len(result["two_ranks"][0]["samples_per_rank"]) == 2
    assert result["wall_ratio"] > 0 and result["overhead"]["ratio"] > 0
    assert "2 ranks" in capsys.readouterr().out
