"""`corelens demo` end to end on the bundled model organism, read back from its output files."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from corelens.cli import main
from corelens.organism.tasks import chance


@pytest.fixture
def one_thread():
    """The organism's matrices are small: a second BLAS thread only waits (271 s against 40 s, measured once)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_demo_finds_the_organisms_heads_and_they_are_causal(tmp_path, capsys, one_thread):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--n", "8"]) == 0
    printed = capsys.readouterr().out
    assert "model: corelens model organism" in printed  # not the random fallback
    # The organism retrieves in layer 0: its top heads by RAM sit there.
    for task, top in (("image", 3), ("video", 3), ("document", 2)):
        heads = pd.read_csv(out / f"rank-{task}" / "heads.csv").sort_values("rank")
        assert (heads["layer"].head(top) == 0).all(), (task, heads.head(top))
        assert heads["mass"].iloc[0] > 2 * heads["mass"].median()
    # Zeroing the image task's top 3 heads takes accuracy to chance or below; the bottom 3 change nothing.
    table = pd.read_csv(out / "ablate-image" / "ablation.csv")
    acc = table.groupby(["set", "k"])["accuracy"].mean()
    lines = (out / "data" / "image-eval" / "image.jsonl").read_text().splitlines()
    level = sum(chance(json.loads(line)) for line in lines) / len(lines)
    assert level == pytest.approx(0.2)  # five shapes
    assert acc["top", 3] <= level
    assert acc["none", 0] == 1.0 and acc["bottom", 3] == 1.0
    # The rest of the demo: stability, every task's sweep, the document's hybrid curve, the report.
    assert (out / "stability" / "spearman.csv").is_file()
    for task in ("image", "video", "document"):
        assert f"[{task} ablate] accuracy by head set" in printed
        assert (out / f"ablate-{task}" / "figures" / "dose_response.png").is_file()
        rows = "question" if task == "document" else "answer"
        assert json.loads((out / f"rank-{task}" / "manifest.json").read_text())["settings"]["query"] == rows
    assert "[document hybrid]" in printed and "[image hybrid]" not in printed
    hybrid = pd.read_csv(out / "hybrid-document" / "hybrid.csv")
    assert hybrid.loc[hybrid["set"] == "dense", "accuracy"].iloc[0] == 1.0
    assert (out / "report.html").stat().st_size > 20000
