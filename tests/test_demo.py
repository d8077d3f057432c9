"""`corelens demo` end to end on the bundled model organism, read back from its output files."""

from __future__ import annotations

import html
import json
import re

import pandas as pd
import pytest

from corelens.cli import main, parser
from corelens.experiments import demo
from corelens.organism.tasks import chance
from corelens.report.summary import Estimate, decided

pytestmark = pytest.mark.e2e  # whole workflows: `make check` leaves this file out

# One contrast as the demo prints it: "3 random heads: 97 % [88–100 %] (2 draws; top lower by 72 points [46–87])"
# or "... (not decided at n = 8)".
CONTRAST = re.compile(
    r"(\d+) (random|bottom) heads: (\d+) % \[(\d+)–(\d+) %\] \((?:\d+ draws; )?"
    r"(?:top (lower|higher) by (\d+) points \[(\d+)–(\d+)\]|not decided at n = (\d+))\)"
)


def _estimates(run, table: str, size: str) -> dict[str, Estimate]:
    """Return each set's estimate as the report reads it: one row, or the summary's row of several draws."""
    rows = pd.read_csv(run / table)
    if (run / "ablation_summary.csv").is_file():
        rows = pd.read_csv(run / "ablation_summary.csv")
        rows = rows[rows["k"].astype(str) == size]
        return {r.set: Estimate(r.accuracy, r.ci_low, r.ci_high) for r in rows.itertuples()}
    rows = rows[rows["keep"].astype(str) == size]
    return {
        kind: Estimate(g["accuracy"].mean(), g["ci_low"].min(), g["ci_high"].max())
        for kind, g in rows.groupby("set")
    }


def test_demo_defaults_are_the_experiments():
    """The command line's defaults are written out (no experiment imported to parse); they must agree."""
    args = parser().parse_args(["demo"])
    assert (args.n, args.eval_n) == (demo.RANK_N, demo.EVAL_N)


def test_demo_prints_each_contrast_decided_or_not_with_its_interval(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--n", "8", "--eval-n", "8"]) == 0
    printed = capsys.readouterr().out
    assert "model: corelens model organism" in printed  # not the random fallback
    # Every stage says what it starts before its progress bar, and the report is announced before it is written.
    for task in ("image", "video", "document"):
        assert f"[{task}] ranking heads on 8 samples" in printed
    assert "[image ablate] zeroing" in printed and "[document hybrid] keeping" in printed
    assert "[report] writing" in printed
    # The organism retrieves in layer 0: its top heads by RAM sit there.
    for task, top in (("image", 3), ("video", 3), ("document", 2)):
        heads = pd.read_csv(out / f"rank-{task}" / "heads.csv").sort_values("rank")
        assert (heads["layer"].head(top) == 0).all(), (task, heads.head(top))
    # Zeroing the image task's top 3 heads takes accuracy to chance or below; the bottom 3 change nothing.
    acc = pd.read_csv(out / "ablate-image" / "ablation.csv").groupby(["set", "k"])["accuracy"].mean()
    lines = (out / "data" / "image-eval" / "image.jsonl").read_text().splitlines()
    assert sum(chance(json.loads(line)) for line in lines) / len(lines) == pytest.approx(0.2)  # five shapes
    assert acc["top", 3] <= 0.2 and acc["none", 0] == 1.0 and acc["bottom", 3] == 1.0

    report = html.unescape(re.sub(r"<[^>]+>", "", (out / "report.html").read_text()))
    sweeps = {
        "image ablate": (out / "ablate-image", "ablation.csv", demo.ABLATE["image"]),
        "video ablate": (out / "ablate-video", "ablation.csv", demo.ABLATE["video"]),
        "document hybrid": (out / "hybrid-document", "hybrid.csv", demo.HYBRID["document"]),
    }
    seen = set()
    for name, (run, table, size) in sweeps.items():
        said = [line for line in printed.splitlines() if line.startswith(f"[{name}] ") and "top" in line]
        sentence = said[-1].split("] ", 1)[1]
        assert sentence in report, name  # the report's finding is the sentence printed
        estimates = _estimates(run, table, size)
        contrasts = CONTRAST.findall(sentence)
        assert {c[1] for c in contrasts} == {"random", "bottom"}, sentence
        for count, kind, *_, way, points, near, far, n in contrasts:
            assert count == size
            want = decided(estimates["top"], estimates[kind])
            if n:  # not decided: the interval of the difference holds 0, at the samples per condition
                assert want == 0 and n == "8", (name, kind)
                seen.add("not decided")
            else:  # decided: the interval excludes 0, on the side named, and holds the difference
                assert want == (-1 if way == "lower" else 1), (name, kind)
                assert 0 < int(near) <= int(points) <= int(far) <= 100, sentence
                seen.add("decided")
    # At 8 ranked samples the document's top 8 is not yet settled (RANK_N is 32 for that reason): both wordings show.
    assert seen == {"decided", "not decided"}
    assert (out / "stability" / "spearman.csv").is_file()
    assert (out / "rank-image" / "figures").is_dir() and (
        out / "ablate-video" / "figures" / "dose_response.png"
    ).is_file()


def test_the_readmes_quoted_demo_lines_are_what_the_demo_prints(tmp_path, capsys):
    """The quick start quotes the demo's finding lines: at the demo's defaults they are printed as quoted."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Quick start")
    block = readme[readme.index("```text\n", start) + len("```text\n") :]
    quoted = block[: block.index("```")].splitlines()
    assert len(quoted) == 2 and all(line.startswith("[") for line in quoted)
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    printed = capsys.readouterr().out.splitlines()
    for line in quoted:
        assert line in printed, f"README quotes a line the demo does not print:\n{line}"
