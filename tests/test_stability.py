"""Head topology and cross-task stability statistics (docs/methods.md#ram), and `corelens stability` on rank runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from corelens.metrics.ram import head_table
from corelens.metrics.rank_agreement import (
    aggregate_ranking,
    jaccard_pairs,
    sample_matrix,
    spearman_pairs,
    universal_heads,
)
from corelens.metrics.topology import depth_bins, depth_profile, gini, mass_shares, sparsity


def _ram(task: str, means: np.ndarray, n: int, seed: int, noise: float = 0.05) -> pd.DataFrame:
    """Return a long RAM table: n samples of (layers, heads) masses scattered around `means`."""
    rng = np.random.default_rng(seed)
    layers, heads = means.shape
    rows = []
    for s in range(n):
        mass = np.clip(means + noise * rng.standard_normal(means.shape), 0, 1)
        for layer in range(layers):
            for head in range(heads):
                rows.append((f"{task}-{s}", task, layer, head, mass[layer, head], 0.5, 1.0, 3, 9))
    return pd.DataFrame(
        rows, columns=["sample_id", "task", "layer", "head", "mass", "share", "lift", "n_omega", "n_visual"]
    )


def test_mass_shares_and_gini_on_known_vectors():
    shares = mass_shares(np.array([4.0, 3.0, 2.0, 1.0]))
    assert shares[0.5] == pytest.approx(0.5) and shares[0.8] == pytest.approx(0.75)
    assert mass_shares(np.array([1.0, 1.0, 1.0, 1.0]))[0.5] == pytest.approx(0.5)
    assert gini(np.ones(10)) == pytest.approx(0.0)
    assert gini(np.array([0, 0, 0, 1.0])) == pytest.approx(0.75)
    values = np.random.default_rng(0).gamma(0.5, size=200)
    # Gini = mean absolute difference / (2 * mean), computed independently
    reference = np.abs(values[:, None] - values[None, :]).mean() / (2 * values.mean())
    assert gini(values) == pytest.approx(reference, rel=1e-12)


def test_sparsity_and_depth_profile_of_a_head_table():
    means = np.zeros((4, 8))
    means[3, :2] = 0.9  # two strong heads in the last layer
    means[2, 0] = 0.5
    table = head_table(_ram("image", means + 0.01, 5, 0, noise=0.0))
    stats_ = sparsity(table)
    assert stats_["heads_for_50pct"] <= 2 / 32 + 1e-12 and stats_["gini"] > 0.7
    profile = depth_profile(table, 3)
    assert profile["core_heads"].tolist() == [0, 0, 1, 2]
    assert profile["depth"].tolist() == [0.25, 0.5, 0.75, 1.0]
    assert profile["core_share"].sum() == pytest.approx(1.0)
    bins = depth_bins(profile)
    assert bins["core_share"].sum() == pytest.approx(1.0) and bins["core_share"].iloc[-1] == pytest.approx(
        2 / 3
    )


def test_spearman_pairs_match_scipy_and_bracket_the_estimate():
    rng = np.random.default_rng(1)
    base = rng.random((3, 6))
    rams = {
        "image": _ram("image", base, 12, 1),
        "video": _ram("video", base + 0.1 * rng.random((3, 6)), 10, 2),
        "document": _ram("document", rng.random((3, 6)), 8, 3),
    }
    pairs = spearman_pairs(rams, n_boot=300, seed=0)
    assert list(zip(pairs["a"], pairs["b"])) == [
        ("image", "video"),
        ("image", "document"),
        ("video", "document"),
    ]
    for row in pairs.itertuples():
        expected = stats.spearmanr(sample_matrix(rams[row.a]).mean(0), sample_matrix(rams[row.b]).mean(0))
        assert row.spearman == pytest.approx(expected.statistic, abs=1e-12)
        assert row.low <= row.spearman + 1e-9 and row.spearman - 1e-9 <= row.high
    related = pairs.set_index(["a", "b"])
    assert related.loc[("image", "video"), "spearman"] > related.loc[("image", "document"), "spearman"]
    again = spearman_pairs(rams, n_boot=300, seed=0)
    pd.testing.assert_frame_equal(pairs, again)


def test_spearman_refuses_runs_of_different_models():
    with pytest.raises(ValueError, match="different numbers of heads"):
        spearman_pairs(
            {"a": _ram("a", np.ones((2, 4)), 3, 0), "b": _ram("b", np.ones((3, 4)), 3, 0)}, n_boot=0
        )


def test_jaccard_universal_and_rank_aggregation():
    a = np.arange(8, dtype=float).reshape(2, 4) / 10  # best: (1,3), (1,2), (1,1)
    b = a.copy()
    b[1, 1], b[0, 0] = 0.0, 0.95  # best: (0,0), (1,3), (1,2)
    tables = {"a": head_table(_ram("a", a, 2, 0, 0.0)), "b": head_table(_ram("b", b, 2, 0, 0.0))}
    assert universal_heads(tables, 3) == [(1, 2), (1, 3)]
    assert jaccard_pairs(tables, 3)["jaccard"].tolist() == [pytest.approx(2 / 4)]
    agg = aggregate_ranking(tables)
    assert (agg.iloc[0]["layer"], agg.iloc[0]["head"]) == (1, 3)
    assert agg["rank"].tolist() == list(range(1, 9))
    assert agg["mean_rank"].is_monotonic_increasing
