"""The dense crossover from measured cost, on the CPU with a fake cost table."""

from __future__ import annotations

import json
import math

import pytest
import torch

from corelens.attention.kernels import Pattern, crossover, prefill
from corelens.bench import crossover_table as bench_crossover
from corelens.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def fake(device="cpu"):
    """Kernel tables at 4k .. 32k: F = 20 % wins from 8k (4k loses), F = 50 % from 32k only (16k loses)."""
    speed = {0.2: (0.6, 1.05, 1.4, 1.9), 0.5: (0.5, 0.9, 0.97, 1.2), 0.05: (0.4, 0.8, 0.95, 0.99)}
    return [
        {
            "tokens": n,
            "device_name": device,
            "per_keep": {str(f): {"full_fraction": f, "speedup": s[i]} for f, s in speed.items()},
        }
        for i, n in enumerate((4096, 8192, 16384, 32768))
    ]


def test_the_crossover_is_the_shortest_length_winning_at_every_longer_one():
    table = crossover.Crossover.measured(fake())
    assert table.shares == (0.05, 0.2, 0.5)
    assert table.lengths == (math.inf, 8192, 32768)  # F = 5 % never won at every length: always dense
    assert table.length(0.1) == 8192 and table.length(0.3) == 32768 and table.length(0.9) == math.inf
    assert table.dense(8191, 0.2) and not table.dense(8192, 0.2)
    # A win followed by a loss at a longer length does not count: the crossover is past the last loss.
    rows = [{"tokens": n, "device": "cpu", "per_keep": {"a": {"full_fraction": 0.2, "speedup": s}}}
            for n, s in ((4096, 1.2), (8192, 0.9), (16384, 1.3))]  # fmt: skip
    assert crossover.Crossover.measured(rows).length(0.2) == 16384


def test_the_dispatcher_runs_dense_below_the_measured_crossover(tmp_path, monkeypatch):
    path = tmp_path / "crossover.json"
    rows = [{"tokens": n, "device_name": "cpu", "per_keep": {"a": {"full_fraction": 0.5, "speedup": s}}}
            for n, s in ((64, 0.8), (96, 1.3), (128, 1.5))]  # fmt: skip
    path.write_text(json.dumps(crossover.Crossover.measured(rows).to_json()))
    monkeypatch.setenv(crossover.ENV, str(path))
    g = torch.Generator().manual_seed(0)
    full = torch.tensor([True, False, False, True])
    ran = {}
    for n in (80, 100):
        q = torch.randn(1, 4, n, 8, generator=g)
        k, v = torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)
        ran[n] = prefill("partitioned", q, k, v, None, full, Pattern(2, 8), 0.3)[1]
        # dense_below None: the kernel itself, whatever the table says (what the benchmark times)
        assert (
            prefill("partitioned", q, k, v, None, full, Pattern(2, 8), 0.3, dense_below=None)[1]
            == "partitioned"
        )
    assert ran == {80: "dense", 100: "partitioned"}
    # The ideal rule would have run both hybrid: the measured table decided.
    monkeypatch.delenv(crossover.ENV)
    q = torch.randn(1, 4, 80, 8, generator=g)
    k = v = torch.randn(1, 2, 80, 8, generator=g)
    assert prefill("partitioned", q, k, v, None, full, Pattern(2, 8), 0.3)[1] == "partitioned"


def test_a_table_of_another_device_is_not_applied(tmp_path, monkeypatch):
    path = tmp_path / "crossover.json"
    path.write_text(json.dumps(crossover.Crossover.measured(fake("NVIDIA H200")).to_json()))
    monkeypatch.setenv(crossover.ENV, str(path))
    with pytest.warns(RuntimeWarning, match="measured on NVIDIA H200"):
        assert crossover.active(torch.device("cpu")) is None


def test_a_malformed_table_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="bad.json: not a crossover table"):
        crossover.Crossover.read(bad)


def test_bench_crossover_prints_the_table_and_writes_it(tmp_path, capsys):
    files = []
    for i, r in enumerate(fake()):
        files.append(tmp_path / f"hybrid-{i}.json")
        files[-1].write_text(json.dumps(r))
    out = tmp_path / "crossover.json"
    assert bench_crossover.main([*map(str, files), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| 20% | 0.60x | 1.05x | 1.40x | 1.90x | 8k |" in printed
    assert "| 5% |" in printed and "never (dense)" in printed
    assert crossover.Crossover.read(out).lengths == (math.inf, 8192, 32768)
    assert (
        bench_crossover.main([*map(str, files), "--out", str(out), "--markdown", str(tmp_path / "c.md")]) == 0
    )
    assert "| 20% |" in (tmp_path / "c.md").read_text()


def anatomy(triton_s, flash_s, device="cpu"):
    seconds = {"hybrid": 1.0}
    seconds.update({"hybrid triton": triton_s} if triton_s is not None else {})
    seconds.update({"hybrid flash": flash_s} if flash_s is not None else {})
    return {"tokens": 32768, "device_name": device, "seconds": seconds}


def test_the_table_keeps_the_streaming_path_the_anatomy_measured_faster(tmp_path, capsys):
    files = []
    for i, r in enumerate(fake()):
        files.append(tmp_path / f"hybrid-{i}.json")
        files[-1].write_text(json.dumps(r))
    out = tmp_path / "crossover.json"
    for (triton_s, flash_s), want in (
        ((2e-3, 1e-3), "flash"),
        ((1e-3, 2e-3), "triton"),
        ((1e-3, None), "triton"),
    ):
        (tmp_path / "anatomy.json").write_text(json.dumps(anatomy(triton_s, flash_s)))
        argv = [*map(str, files), "--out", str(out), "--anatomy", str(tmp_path / "anatomy.json")]
        assert bench_crossover.main(argv) == 0
        assert crossover.Crossover.read(out).stream == want
        assert f"streaming heads for --kernel auto: {want}" in capsys.readouterr().out
    assert bench_crossover.main([*map(str, files), "--out", str(out)]) == 0  # no anatomy: the Triton kernel
    assert crossover.Crossover.read(out).stream == "triton"
    (tmp_path / "anatomy.json").write_text(json.dumps(anatomy(2e-3, 1e-3, "NVIDIA H200")))
    argv = [*map(str, files), "--out", str(out), "--anatomy", str(tmp_path / "anatomy.json")]
    assert bench_crossover.main(argv) == 1
    assert "an anatomy of 'NVIDIA H200' beside kernel tables of 'cpu'" in capsys.readouterr().err
    bad = tmp_path / "bad-stream.json"
    bad.write_text(json.dumps({**crossover.Crossover.measured(fake()).to_json(), "stream": "flex"}))
    with pytest.raises(InputError, match="unknown streaming path 'flex'"):
        crossover.Crossover.read(bad)
