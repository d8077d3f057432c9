"""The GPU anatomy step (corelens.bench.stream_anatomy) on the CPU at a tiny size: every part runs and is recorded."""

from __future__ import annotations

import json

import pytest

from corelens.attention.kernels import stream as triton_stream
from corelens.bench import stream_anatomy

# About 20 s on one core (the Triton kernel under its interpreter, 4 calls a part): end to end, in `make test`.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile"),
    pytest.mark.skipif(
        not triton_stream.available() or not triton_stream.interpreting(), reason="needs TRITON_INTERPRET=1"
    ),
]


def test_anatomy_times_every_part_and_records_the_streams_option(tmp_path, capsys):
    out = tmp_path / "anatomy.json"
    argv = ["--device", "cpu", "--dtype", "float32", "--tokens", "80", "--heads", "4", "--kv-heads", "2"]
    argv += ["--head-dim", "16", "--sink", "4", "--window", "16", "--json", str(out)]
    assert stream_anatomy.main(argv) == 0
    result = json.loads(out.read_text())
    parts = {"stock", "full only", "flex window", "flex sink", "merge", "triton stream", "flash window"}
    parts |= {"flash sink", "flash merge", "flash stream", "hybrid", "hybrid triton", "hybrid flash"}
    parts |= {"hybrid streams=2", "first stock", "first hybrid"}
    assert set(result["seconds"]) == parts
    assert all(s > 0 for s in result["seconds"].values())
    # streams=2 asked, one stream used off a GPU; the faster path named from the two whole-kernel times.
    assert result["streams"] == {"asked": 2, "used": 1} and result["device_name"] == "cpu"
    seconds = result["seconds"]
    assert result["faster_stream"] == min(("triton", "flash"), key=lambda p: seconds[f"hybrid {p}"])
    printed = capsys.readouterr().out
    assert "streams=2 ran on 1 CUDA stream (no GPU" in printed and "faster streaming path:" in printed
    assert stream_anatomy.main([*argv[:-2], "--repeats", "2"]) == 2  # a median of fewer than 3 is refused
