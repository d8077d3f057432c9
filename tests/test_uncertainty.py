"""Ranking uncertainty (issue 22): intervals and P(top-k), the stability curve, ranking resamples."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from corelens.cli import main
from corelens.errors import CorelensError
from corelens.metrics.headsets import head_sets, select
from corelens.metrics.uncertainty import (
    bootstrap_heads,
    first_n,
    resampled_tables,
    stability_curve,
    uncertain_heads,
)
from corelens.organism.tasks import generate

COLUMNS = ["sample_id", "task", "layer", "head", "mass", "share", "lift", "n_omega", "n_visual"]


def _long(values: np.ndarray, heads_per_layer: int = 4) -> pd.DataFrame:
    """Return a long RAM table from a (samples, heads) matrix; head j is (j // heads_per_layer, j % ...)."""
    n, heads = values.shape
    sample, head = np.meshgrid(np.arange(n), np.arange(heads), indexing="ij")
    return pd.DataFrame(
        {
            "sample_id": [f"s{i:04d}" for i in sample.ravel()],
            "task": "image",
            "layer": head.ravel() // heads_per_layer,
            "head": head.ravel() % heads_per_layer,
            "mass": values.ravel(),
            "share": 0.5,
            "lift": 1.0,
            "n_omega": 3,
            "n_visual": 9,
        },
        columns=COLUMNS,
    )


def test_mass_intervals_cover_the_true_mean_at_about_the_nominal_rate():
    rng = np.random.default_rng(0)
    true = np.linspace(0.1, 0.9, 16)
    hits = total = 0
    for trial in range(60):
        values = true + rng.gamma(2.0, 0.1, size=(80, 16)) - 0.2  # skewed noise, mean 0
        table = bootstrap_heads(_long(values), [4], n_boot=1000, seed=trial)
        truth = true[table["layer"] * 4 + table["head"]]
        hits += int(((table["mass_low"] <= truth) & (truth <= table["mass_high"])).sum())
        total += len(table)
        assert (table["rank_low"] <= table["rank"]).all() and (table["rank"] <= table["rank_high"]).all()
    assert 0.92 <= hits / total <= 0.975  # nominal 0.95 (tests/test_calibration.py checks n = 8, 24, 100)


def test_top_k_probability_is_one_for_a_dominant_head_and_a_half_for_two_exchangeable_edge_heads():
    rng = np.random.default_rng(1)
    n = 60
    values = rng.uniform(0.0, 0.1, size=(n, 8))  # weak heads
    values[:, 0] = 0.9 + rng.uniform(0, 0.05, n)  # dominant in every sample
    values[:, 1] = 0.7 + rng.uniform(0, 0.05, n)  # second, clear
    # Heads 6 and 7 compete for third place: per pair of samples one is up by u and the other down by u, so
    # the full-data means are equal and every resample is as likely to favour either.
    u = rng.uniform(0.05, 0.2, n // 2)
    values[:, 6] = 0.4 + np.concatenate([u, -u])
    values[:, 7] = 0.4 - np.concatenate([u, -u])
    table = bootstrap_heads(_long(values), [1, 3], n_boot=2000, seed=0).set_index(["layer", "head"])
    assert table.loc[(0, 0), "p_top1"] == 1.0 and table.loc[(0, 0), "p_top3"] == 1.0
    assert table.loc[(0, 0), ["rank_low", "rank_high"]].tolist() == [1, 1]
    assert table.loc[(0, 1), "p_top1"] == 0.0 and table.loc[(0, 1), "p_top3"] == 1.0
    edge = table.loc[[(1, 2), (1, 3)], "p_top3"]
    assert edge.to_numpy() == pytest.approx([0.5, 0.5], abs=0.05)
    assert edge.sum() == pytest.approx(1.0)
    assert table.loc[[(0, 2), (0, 3), (1, 0), (1, 1)], "p_top3"].eq(0).all()
    marked = uncertain_heads(table.reset_index())
    assert marked.sum() == 2 and table.reset_index()[marked.to_numpy()]["head"].tolist() in ([2, 3], [3, 2])


def test_curve_jaccard_tends_to_one_with_a_clear_gap():
    rng = np.random.default_rng(2)
    means = np.r_[np.full(4, 1.0), np.full(12, 0.6)]  # a gap of 0.4 after the top 4
    ram = _long(means + rng.normal(0, 0.6, size=(240, 16)))
    curve = stability_curve(ram, [4], sizes=[2, 5, 10, 30, 60, 120], pairs=200, seed=0)
    jaccard = curve.set_index("n")["jaccard"]
    assert jaccard[2] < 0.6 and jaccard[120] > 0.99
    assert np.all(np.diff(jaccard.to_numpy()) > -0.02)  # non-decreasing up to Monte Carlo noise
    assert first_n(curve, 4) is not None and first_n(curve, 4) <= 60
    assert (curve["jaccard_p05"] <= curve["jaccard_p95"]).all() and curve["jaccard_p05"].iloc[-1] == 1.0
    # Spearman among the tied lower heads stays far from 1; only Jaccard of the gapped top set settles.
    assert curve["spearman"].iloc[-1] < 0.9
    with pytest.raises(CorelensError, match="at least 4"):
        stability_curve(ram[ram["sample_id"] < "s0003"], [4])


def test_resampled_tables_rank_bootstrap_means_and_without_resampling_repeat_the_ranking():
    rng = np.random.default_rng(3)
    ram = _long(rng.uniform(0, 1, size=(10, 8)))
    plain = resampled_tables(ram, 2, 0, resample=False)
    from corelens.metrics.ram import head_table

    for table in plain:
        pd.testing.assert_frame_equal(table, head_table(ram))
    drawn = resampled_tables(ram, 5, 0)
    assert len({tuple(select(t, "top", 3)) for t in drawn}) > 1
    assert all(sorted(t["rank"]) == list(range(1, 9)) for t in drawn)
    assert resampled_tables(ram, 5, 0)[4].equals(drawn[4])  # seeded


def test_stable_head_set_takes_the_heads_above_p():
    table = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [1, 2, 3, 4], "p_top2": [1.0, 0.6, 0.4, 0.0]}
    )
    assert select(table, "stable", 2, p=0.9) == ((0, 0),)
    assert select(table, "stable", 2, p=0.4) == ((0, 0), (0, 1), (1, 0))
    sets = head_sets(table, ["2"], ["top", "stable"], stable_p=0.5)
    assert [(hs.kind, hs.count, hs.overlap) for hs in sets] == [("top", 2, 2), ("stable", 2, 2)]
    with pytest.raises(CorelensError, match="no p_top3 column"):
        select(table, "stable", 3)


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint
    from corelens.organism.tasks import WORDS

    root = tmp_path_factory.mktemp("uncertainty")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "ident", 8, seed=1)
    run = root / "rank"
    argv = [
        "rank",
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(run),
        "--k",
        "1,25%",
        "--overlays",
        "0",
    ]
    assert main([*argv, "--n-boot", "300"]) == 0
    return model, run, generate("image", root / "eval", 3, seed=2)


def test_rank_writes_intervals_and_the_curve_reaches_the_report(ranked, tmp_path, capsys):
    _, run, _ = ranked
    heads = pd.read_csv(run / "heads.csv")
    assert {"mass_low", "mass_high", "rank_low", "rank_high", "p_top1", "p_top2"} <= set(heads.columns)
    assert ((heads["mass_low"] <= heads["mass"]) & (heads["mass"] <= heads["mass_high"])).all()
    assert heads["p_top1"].sum() == pytest.approx(1.0) and heads["p_top2"].sum() == pytest.approx(2.0)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["uncertainty"] == {"k": ["1", "25%"], "counts": [1, 2], "n_boot": 300, "seed": 0}
    model, data = ranked[0], manifest["settings"]["data"]
    capsys.readouterr()
    assert (
        main(["rank", "--model", str(model), "--data", data, "--out", str(run), "--k", "1,25%"]) == 0
    )  # resumed
    assert "top-2 membership uncertain (0.2 < P < 0.8): " in capsys.readouterr().out
    assert main(["stability", "--curve", str(run), "--k", "2", "--pairs", "50"]) == 0
    assert "top-2 Jaccard" in capsys.readouterr().out
    curve = pd.read_csv(run / "stability_curve.csv")
    assert curve["n"].tolist() == [2, 3, 4] and (curve["pairs"] == 50).all()
    assert (run / "figures" / "stability_curve.png").stat().st_size > 5000
    report = tmp_path / "report.html"
    assert main(["report", str(run), "--out", str(report)]) == 0
    assert "Stability curve (8 samples" in report.read_text() and "stability_curve.csv" in report.read_text()
    assert main(["stability", "--curve", str(run), str(run)]) == 2
    assert "--curve takes one rank run" in capsys.readouterr().err


def test_bad_uncertainty_options_are_one_line_errors(ranked, tmp_path, capsys):
    model, run, data = ranked
    rank = ["rank", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "r")]
    assert main([*rank, "--n-boot", "0"]) == 2
    assert "--n-boot: must be at least 1" in capsys.readouterr().err  # refused while the options are parsed
    ablate = ["ablate", "--model", str(model), "--data", str(data), "--heads", str(run / "heads.csv")]
    assert main([*ablate, "--out", str(tmp_path / "a"), "--rank-resamples", "-1"]) == 2
    assert "--rank-resamples: 0 (none) or a count: must be at least 1" in capsys.readouterr().err
    lone = tmp_path / "lone" / "heads.csv"
    lone.parent.mkdir()
    lone.write_bytes((run / "heads.csv").read_bytes())
    ablate[-1] = str(lone)
    assert main([*ablate, "--out", str(tmp_path / "b"), "--rank-resamples", "2"]) == 2
    assert "needs the rank run's ram.parquet" in capsys.readouterr().err


def test_resampled_ablation_with_one_unresampled_draw_equals_the_plain_run(ranked, tmp_path):
    import corelens
    from corelens.experiments.ablate import sweep

    model, run, data = ranked
    m = corelens.load(model, device="cpu")
    common = dict(ks=["1", "25%"], sets=("top", "bottom"), max_new_tokens=2, warn=lambda _: None)
    plain = sweep(m, data, run / "heads.csv", **common, out=tmp_path / "plain")
    same = sweep(
        m, data, run / "heads.csv", **common, rank_resamples=1, resample=False, out=tmp_path / "same"
    )
    drawn = same.table[same.table["set"] == "top-resampled"].reset_index(drop=True)
    top = plain.table[plain.table["set"] == "top"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        same.table[same.table["set"] != "top-resampled"].reset_index(drop=True), plain.table
    )
    assert drawn[["k", "k_heads", "accuracy", "correct", "n"]].equals(
        top[["k", "k_heads", "accuracy", "correct", "n"]]
    )
    assert (drawn["overlap"] == drawn["k_heads"]).all()
    sets = {s["name"]: s["heads"] for s in json.loads((tmp_path / "same" / "headsets.json").read_text())}
    assert sets["top-resampled/1/s0"] == sets["top/1"] and sets["top-resampled/25%/s0"] == sets["top/25%"]
    summary = pd.read_csv(tmp_path / "same" / "resampled.csv")
    assert (summary["single"] == summary["median"]).all() and (summary["resamples"] == 1).all()
    many = sweep(m, data, run / "heads.csv", **common, rank_resamples=4, out=tmp_path / "many")
    assert (many.resampled["resamples"] == 4).all()
    assert (
        (many.resampled["low"] <= many.resampled["median"])
        & (many.resampled["median"] <= many.resampled["high"])
    ).all()


def test_hybrid_with_rank_resamples_writes_the_resampled_summary(ranked, tmp_path):
    model, run, data = ranked
    out = tmp_path / "hybrid"
    argv = ["hybrid", "--model", str(model), "--data", str(data), "--heads", str(run / "heads.csv"), "--out", str(out),
            "--keep", "2", "--sets", "top,stable", "--stable-p", "0.5", "--seeds", "1", "--sink", "2",
            "--window", "4", "--max-new-tokens", "2", "--rank-resamples", "3"]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_csv(out / "hybrid.csv")
    assert table["set"].tolist() == ["dense", "top", "stable", *["top-resampled"] * 3]
    stable = pd.read_csv(run / "heads.csv").query("p_top2 >= 0.5")
    assert table.loc[table["set"] == "stable", "full_heads"].item() == len(stable)
    summary = pd.read_csv(out / "resampled.csv")
    assert summary["resamples"].tolist() == [3] and 1 <= summary["distinct_sets"].item() <= 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["rank_resamples"] == 3 and manifest["settings"]["stable_p"] == 0.5


def test_hybrid_figure_takes_equal_accuracies_of_sets_with_one_size(tmp_path):
    from corelens.report.curves import accuracy_vs_kept

    # Three stable sets (kept 2, 3, 5) of the same 2 heads: the mean of 3 x 0.675 rounds above 0.675.
    table = pd.DataFrame(
        {
            "set": ["dense", "stable", "stable", "stable"],
            "fraction": [1.0, 0.0625, 0.0625, 0.0625],
            "accuracy": [1.0, 0.675, 0.675, 0.675],
            "ci_low": [0.9, 0.5, 0.5, 0.5],
            "ci_high": [1.0, 0.8, 0.8, 0.8],
            "n": [40, 40, 40, 40],
        }
    )
    assert table.query("set == 'stable'")["accuracy"].mean() > table["accuracy"].iloc[1:].max()
    assert accuracy_vs_kept(table, tmp_path / "h.png").stat().st_size > 5000
