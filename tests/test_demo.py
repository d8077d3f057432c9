"""`corelens demo` end to end (on a tiny random checkpoint, so that it runs without the organism)."""

from __future__ import annotations

from corelens.cli import main
from corelens.models.tiny import build_tiny_checkpoint
from corelens.organism.tasks import WORDS


def test_demo_ranks_three_tasks_and_writes_the_report(tmp_path, capsys):
    model = build_tiny_checkpoint(
        "qwen2_5_vl", tmp_path / "model", words=WORDS, layers=2, heads=4, kv_heads=2
    )
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--model", str(model), "--n", "2"]) == 0
    printed = capsys.readouterr().out
    for task in ("image", "video", "document"):
        assert f"[{task}] top 5 heads by mean RAM of the" in printed
        assert (out / f"rank-{task}" / "heads.csv").is_file()
    assert (out / "stability" / "spearman.csv").is_file()
    # Causal ablation of every task's heads and hybrid attention of the document heads, on other samples.
    for task in ("image", "video", "document"):
        assert f"[{task} ablate] accuracy by head set" in printed
        assert (out / f"ablate-{task}" / "ablation.csv").is_file()
        assert (out / f"ablate-{task}" / "figures" / "dose_response.png").is_file()
        rows = "question" if task == "document" else "answer"
        assert f'"query": "{rows}"' in (out / f"rank-{task}" / "manifest.json").read_text()
    assert "[document hybrid]" in printed and "[image hybrid]" not in printed
    assert (out / "hybrid-document" / "hybrid.csv").is_file()
    assert f"report: {out / 'report.html'}" in printed
    assert (out / "report.html").stat().st_size > 20000
