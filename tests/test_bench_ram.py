"""End-to-end check of the RAM-probe benchmark at a tiny width (no timing assertions)."""

from __future__ import annotations

import json
import time

import pytest

from corelens.bench import ram_probe as ram
from corelens.bench.memory import PeakRSS, max_rss_mb, rss_bytes
from corelens.bench.ram_probe import estimate_eager_peak_mb, probe_sets, run_ram_benchmark
from corelens.bench.synthetic import Decoder, mrope_section
from corelens.cli import main as cli_main

pytestmark = pytest.mark.e2e  # whole workflows: `make check` leaves this file out

TINY = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "intermediate": 256}


def test_peak_rss_sees_a_transient_allocation() -> None:
    """PeakRSS reports an allocation made and freed inside the block, relative to the RSS at entry."""
    assert rss_bytes() > 0
    with PeakRSS() as peak:
        block = bytearray(64 << 20)
        block[::4096] = b"\1" * len(block[::4096])  # touch every page
        time.sleep(0.02)
        del block
    assert peak.peak_mb >= 48
    assert peak.samples > 0
    assert max_rss_mb() >= peak.peak_rss_mb - 1


def test_probe_sets_and_mrope() -> None:
    """Omega lies inside the visual span; the query rows are the last positions."""
    sets = probe_sets(8192, 1024, 32)
    assert sets["visual"][0] == 64 and sets["visual"][-1] == 8192 - 65
    assert len(sets["omega"]) == 1024 and sets["omega"][0] > 64 and sets["omega"][-1] < 8192 - 64
    assert sets["rows"].tolist() == list(range(8160, 8192))
    assert mrope_section(128) == [16, 24, 24] and sum(mrope_section(32)) == 16
    assert (
        estimate_eager_peak_mb(8192, Decoder(layers=4, hidden=2048, heads=16, kv_heads=2, intermediate=5632))
        > 18 * 1024
    )


@pytest.fixture(scope="module")
def result() -> dict:
    """Run the benchmark once at N = 256 with tiny widths."""
    return run_ram_benchmark(256, **TINY, repeats=1)


def test_run_ram_benchmark_end_to_end(result: dict) -> None:
    """All keys are there, times and peaks are positive and the probe agrees with eager attention."""
    keys = [
        "tokens", "layers", "hidden", "heads", "kv_heads", "target_tokens", "query_rows",
        "sdpa_s", "probe_s", "eager_s", "sdpa_peak_mb", "probe_peak_mb", "eager_peak_mb",
        "probe_time_ratio", "probe_mem_ratio", "eager_mem_over_probe",
        "torch", "transformers", "threads", "machine", "probe_check",
    ]  # fmt: skip
    missing = [k for k in keys if k not in result]
    assert not missing
    assert result["tokens"] == 256 and result["layers"] == 2 and result["hidden"] == 128
    for v in ("sdpa", "probe", "eager"):
        assert result[f"{v}_s"] > 0
        assert result[f"{v}_maxrss_mb"] > 0
    assert result["probe_check"] is not None and result["probe_check"] <= 1e-5
    assert result["probe_check_visual"] <= 1e-5
    assert result["probe_output_max_abs_diff"] == 0.0
    json.dumps(result)  # serialisable


def test_main_writes_json_and_passes_no_eager(result: dict, tmp_path, monkeypatch, capsys) -> None:
    """The command line passes --no-eager through, writes the JSON file and prints a summary."""
    seen = {}

    def fake(tokens: int, **kwargs) -> dict:
        seen.update(kwargs, tokens=tokens)
        return result

    monkeypatch.setattr(ram, "run_ram_benchmark", fake)
    path = tmp_path / "out" / "ram.json"
    assert (
        cli_main(["bench", "ram", "--tokens", "256", "--json", str(path), "--no-eager", "--layers", "2"]) == 0
    )
    assert seen["tokens"] == 256 and seen["eager"] is False and seen["layers"] == 2
    assert json.loads(path.read_text())["probe_check"] == result["probe_check"]
    assert "probe/sdpa" in capsys.readouterr().out
