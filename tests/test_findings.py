"""The report's findings on generated tables: one sentence per head-set size, percent throughout, the top set
against its controls, "—" for missing values and "not decided at n = N" where an interval of a difference
holds zero. No model, no browser: each test writes a few CSV rows."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from corelens.report.summary import Estimate, difference, summary_section, versus

MANIFEST = {"settings": {"data": "/x/image.jsonl", "model": "tiny"}, "samples": 8}


def _ablation(tmp_path, rows, summary=None, name="ablate-image"):
    run = tmp_path / name
    run.mkdir()
    columns = ["set", "k", "k_heads", "seed", "op", "accuracy", "n", "correct", "ci_low", "ci_high", "heads"]
    pd.DataFrame(rows, columns=columns).to_csv(run / "ablation.csv", index=False)
    if summary is not None:
        summary.to_csv(run / "ablation_summary.csv", index=False)
    return run


def _findings(run, command):
    text = summary_section([run], [{**MANIFEST, "command": command}])
    return re.sub(r"<[^>]+>", "", str(text)).replace("&#39;", "'")


BASE = ["none", "0", 0, None, "zero", 1.0, 8, 8, 0.68, 1.0, ""]
TOP = ["top", "3", 3, None, "zero", 0.25, 8, 2, 0.07, 0.59, "L1H2 L0H3 L1H0"]


def test_an_ablation_finding_sets_the_top_heads_against_random_and_bottom(tmp_path):
    rows = [BASE, TOP, ["bottom", "3", 3, None, "zero", 1.0, 8, 8, 0.68, 1.0, "L0H0 L0H1 L0H2"]]
    rows += [["random", "3", 3, s, "zero", 1.0, 8, 8, 0.68, 1.0, "L0H1 L1H3 L0H0"] for s in range(3)]
    text = _findings(_ablation(tmp_path, rows), "ablate")
    assert (
        "Zeroing the top 3 heads (L1H2 L0H3 L1H0) drops accuracy on image.jsonl from 100 % [68–100 %] "
        "to 25 % [7–59 %]" in text
    )
    assert "3 random heads: 100 % [68–100 %] (3 draws; top lower by 75 points [" in text
    assert "3 bottom heads: 100 % [68–100 %] (top lower by 75 points [" in text
    assert "0.25" not in text and "nan" not in text.lower()  # percent only, no raw fraction


def test_a_difference_whose_interval_holds_zero_is_not_decided(tmp_path):
    rows = [BASE, ["top", "3", 3, None, "zero", 0.75, 8, 6, 0.41, 0.93, "L1H2"]]
    rows += [["random", "3", 3, 0, "zero", 0.875, 8, 7, 0.53, 0.98, "L0H1"]]
    text = _findings(_ablation(tmp_path, rows), "ablate")
    assert (
        "moves accuracy on image.jsonl from 100 % [68–100 %] to 75 % [41–93 %] (not decided at n = 8)" in text
    )
    assert "3 random heads: 88 % [53–98 %] (not decided at n = 8)" in text
    assert "lower by" not in text


def test_the_two_level_interval_of_ablation_summary_is_used_and_extra_columns_are_ignored(tmp_path):
    rows = [BASE, TOP] + [["random", "3", 3, s, "zero", a, 8, round(8 * a), 0.5, 1.0, ""] for s, a in
                          enumerate([1.0, 0.875, 0.75])]  # fmt: skip
    summary = pd.DataFrame(
        {"set": ["top", "random"], "k": ["3", "3"], "k_heads": [3, 3], "seeds": [1, 3],
         "accuracy": [0.25, 0.875], "sd": [0.0, 0.125], "ci_low": [0.07, 0.2], "ci_high": [0.59, 1.0],
         "interval": ["wilson", "two-level bootstrap"], "draw_heads": ["L1H2", "L0H1|L0H2|L1H1"],
         "between_draw_sd": [0.0, 0.125]}
    )  # fmt: skip
    text = _findings(_ablation(tmp_path, rows, summary), "ablate")
    # The wide two-level interval [20–100 %] decides nothing; the envelope of the draws [50–100 %] would.
    assert "3 random heads: 88 % [20–100 %] (3 draws; not decided at n = 8)" in text


def test_missing_values_are_dashes_never_nan(tmp_path):
    rows = [["none", "0", 0, None, "zero", np.nan, 0, 0, np.nan, np.nan, ""], TOP]
    rows += [["layer-matched", "3", 3, 0, "zero", 0.5, 8, 4, np.nan, np.nan, ""]]
    text = _findings(_ablation(tmp_path, rows), "ablate")
    assert "from — to 25 % [7–59 %] (not decided at n = 0 / 8)" in text
    assert "3 layer-matched heads: 50 % (not decided at n = 8)" in text
    assert "nan" not in text.lower()


def test_a_hybrid_finding_compares_the_kept_top_heads_with_their_controls(tmp_path):
    run = tmp_path / "hybrid-image"
    run.mkdir()
    table = pd.DataFrame(
        [["dense", "100%", 88, 1.0, None, 1.0, 32, 32, 0.89, 1.0, 1.0, "query", "all"],
         ["top", "8", 8, 8 / 88, None, 1.0, 32, 32, 0.89, 1.0, 1.9, "query", "L1H2"],
         ["random", "8", 8, 8 / 88, 0, 0.375, 32, 12, 0.23, 0.55, 1.9, "query", "L0H0"],
         ["random", "8", 8, 8 / 88, 1, 0.40625, 32, 13, 0.26, 0.58, 1.9, "query", "L0H1"],
         ["bottom", "8", 8, 8 / 88, None, 0.21875, 32, 7, 0.11, 0.39, 1.9, "query", "L0H3"]],
        columns=["set", "keep", "full_heads", "fraction", "seed", "accuracy", "n", "correct", "ci_low",
                 "ci_high", "ideal_speedup", "granularity", "heads"],
    ).assign(extra=1)  # fmt: skip
    table.to_csv(run / "hybrid.csv", index=False)
    text = _findings(run, "hybrid")
    assert (
        "Keeping the top 8 heads (9 % of all) full keeps accuracy on image.jsonl at 100 % [89–100 %] "
        "against 100 % [89–100 %] dense (not decided at n = 32), ideal speed-up 1.90×" in text
    )
    assert "8 random heads: 39 % [23–58 %] (2 draws; top higher by 61 points [" in text
    assert "8 bottom heads: 22 % [11–39 %] (top higher by 78 points [" in text


def test_difference_interval_is_the_mover_of_the_two_intervals():
    d, low, high = difference(Estimate(0.5, 0.3, 0.7), Estimate(0.5, 0.3, 0.7))
    assert d == 0 and low == pytest.approx(-np.hypot(0.2, 0.2)) and high == pytest.approx(np.hypot(0.2, 0.2))
    assert (
        versus(Estimate(0.9, 0.8, 0.95, 40), Estimate(0.5, 0.35, 0.65, 40))
        == "top higher by 40 points [22–56]"
    )
    assert versus(Estimate(0.9, 0.8, 0.95, 40), Estimate(0.8, 0.65, 0.9, 40)) == "not decided at n = 40"


def test_table_cells_show_missing_values_as_dashes(tmp_path):
    from corelens.report.html import _table

    path = tmp_path / "hybrid.csv"
    pd.DataFrame({"set": ["dense", "top"], "seed": [None, 1], "accuracy": [np.nan, 0.5]}).to_csv(
        path, index=False
    )
    text = str(_table(path))
    assert "nan" not in text.lower() and text.count("<td>—</td>") == 2 and "<td>0.5</td>" in text
