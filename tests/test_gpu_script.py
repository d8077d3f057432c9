"""benchmarks/gpu.sh fits its device calls: each part's step limits add up to at most 8 minutes (nothing is run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def limits(part: str, tmp_path: Path) -> dict[str, int]:
    env = {**os.environ, "LIMITS": "1", "OUT": str(tmp_path / "out")}
    env.pop("DRY", None)
    proc = subprocess.run(
        ["bash", "benchmarks/gpu.sh", part], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert not any((tmp_path / "out").iterdir())  # listing the limits writes nothing
    steps = re.findall(r"^limit (\d+) (.+)$", proc.stdout, flags=re.M)
    return {name: int(seconds) for seconds, name in steps}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_each_part_of_gpu_sh_fits_one_device_call(tmp_path):
    prefill, probe = limits("prefill", tmp_path), limits("probe", tmp_path)
    assert sum(prefill.values()) <= 480 and sum(probe.values()) <= 480, (prefill, probe)
    # The anatomy (Triton against flash, streams=2) runs before the crossover that reads it, in the same part.
    names = list(prefill)
    assert names.index("anatomy") < names.index("crossover") and "kernel table N=131072" in prefill
    # The probe against the stock forward at 32k and at 128k.
    assert {"bench ram N=32768", "bench ram N=131072", "bench decode N=65536"} <= set(probe)
    assert set(prefill).isdisjoint(probe)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("part", ["prefill", "probe"])
def test_a_failed_parity_stops_its_part_with_exit_1(part, tmp_path):
    """A parity step that fails (here every python call fails) ends the part before any timing, exit 1."""
    env = {**os.environ, "DRY": "1", "PYTHON": "false", "OUT": str(tmp_path / "out")}
    proc = subprocess.run(
        ["bash", "benchmarks/gpu.sh", part], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stdout
    assert "parity failed: no timing is worth running" in proc.stdout
    assert (
        "== bench" not in proc.stdout
        and "== kernel table" not in proc.stdout
        and "== anatomy" not in proc.stdout
    )
