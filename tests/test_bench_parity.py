"""The GPU parity steps fail loudly: a kernel past its tolerance makes `kernel_parity` exit 1 (run on the CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from corelens.attention.kernels import Pattern
from corelens.attention.kernels import partition as part
from corelens.bench import kernel_parity

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(kernel_parity, "DRY_SIZES", ((40, 2, 8, 5),))
    monkeypatch.setattr(kernel_parity, "DRY_WIDE", (40, 2, 8))


def test_kernel_parity_passes_and_exits_zero(small, capsys):
    assert kernel_parity.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "stream=flex" in out and "stream=flash" in out and "'streams': 2" in out


def test_a_flash_merge_made_wrong_makes_kernel_parity_exit_one(small, monkeypatch, capsys):
    from corelens.attention.kernels import flashstream

    monkeypatch.setattr(
        kernel_parity, "streams", lambda device, dtype=None: ("flash",)
    )  # no interpreter: fast
    monkeypatch.setattr(flashstream, "merge_", lambda out, lse, other, other_lse: None)  # the bug: no merge
    assert kernel_parity.main(["--dry-run"]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.endswith("FAIL")]
    assert failed and all("flash" in line for line in failed)


def test_a_kernel_made_wrong_makes_kernel_parity_exit_one(small, monkeypatch, capsys):
    right = part.streaming

    def no_sinks(q, k, v, pattern, scale, compiled):  # the bug: the window pass alone, sinks dropped
        return right(q, k, v, Pattern(0, pattern.window), scale, compiled)

    monkeypatch.setattr(part, "streaming", no_sinks)
    assert kernel_parity.main(["--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "partitioned" in out and "FAIL" in out and "kernel parity FAILED" in out


def test_a_flash_operator_that_refuses_is_no_candidate_not_a_failure(small, monkeypatch, capsys):
    from corelens.attention.kernels import flashstream

    def refuses(*args, **kwargs):  # as a torch build whose flash-attention takes no window would
        raise RuntimeError("window_size_left is not supported")

    monkeypatch.setattr(
        kernel_parity, "streams", lambda device, dtype=None: ("flash",)
    )  # no interpreter: fast
    monkeypatch.setattr(flashstream, "reference_windowed", refuses)
    assert kernel_parity.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stream=flash: unavailable (RuntimeError: window_size_left is not supported)" in out
    assert "FAIL" not in out


def test_probe_decode_exits_one_when_a_check_fails(monkeypatch, capsys):
    from corelens.bench import probe_decode

    monkeypatch.setattr(probe_decode, "decode_check", lambda device, dtype: dtype == "float32")
    assert probe_decode.main(["--device", "cpu", "--tokens", "128"]) == 1
    assert "FAILED: 1 of 3" in capsys.readouterr().out
    monkeypatch.setattr(probe_decode, "decode_check", lambda device, dtype: True)
    assert probe_decode.main(["--device", "cpu", "--tokens", "128"]) == 0


def test_probe_check_fails_when_the_batched_rows_are_wrong(monkeypatch):
    from corelens.attention import probes
    from corelens.bench import probe_decode

    assert probe_decode.probe_check(torch.device("cpu"), 128)
    right = probes.RamProbe.pre

    def skewed(self, call):  # the bug: the batched path (one chunk) sees its keys scaled
        if probes.chunk_bytes(call.query.device) > 4 * 28 * 128:
            call = dataclasses.replace(call, key=call.key * 1.5)
        return right(self, call)

    monkeypatch.setattr(probes.RamProbe, "pre", skewed)
    assert not probe_decode.probe_check(torch.device("cpu"), 128)
