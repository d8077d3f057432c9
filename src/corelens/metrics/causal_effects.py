"""Causal importance of heads beside RAM: per-head effect intervals, causal ranks, their Spearman with RAM.

docs/importance.md. The inputs are (samples, heads) matrices of single-head effects, heads in (layer, head)
order: the drop in the answer's log-probability and in greedy accuracy when one head is intervened on, and
optionally the attribution-patching estimate of the log-probability drop. Intervals of the per-head means
come from the posterior draws RAM's intervals use (`metrics.posterior`, a Bayesian bootstrap with one pooled
prior pseudo-sample); rank bounds from `uncertainty.rank_bounds`; the Spearman interval between RAM and the
causal effect from `rank_agreement.spearman_interval` (each matrix drawn from its own posterior: the ranking and
the importance run hold different samples).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from corelens.errors import CorelensError
from corelens.metrics.posterior import posterior_means
from corelens.metrics.rank_agreement import spearman_interval, spearman_rows
from corelens.metrics.uncertainty import LEVEL, rank_bounds, ranks_of

DISAGREE = 5  # heads listed where the RAM rank and the causal rank differ most
COLUMNS = [
    "layer", "head", "ram", "ram_rank", "drop_logp", "drop_logp_low", "drop_logp_high", "drop_acc",
    "drop_acc_low", "drop_acc_high", "attribution", "attribution_low", "attribution_high", "effect",
    "causal_rank", "causal_rank_low", "causal_rank_high", "rank_diff", "n",
]  # fmt: skip


def _mean_interval(matrix: np.ndarray | None, draws: int, seed: int, level: float = LEVEL) -> tuple:
    """Return (mean, low, high, posterior draws) per head of a (samples, heads) matrix; NaNs without one."""
    if matrix is None or not len(matrix):
        return (None,) * 4
    drawn = posterior_means(matrix, draws, seed)
    tail = (1 - level) / 2
    low, high = np.quantile(drawn, [tail, 1 - tail], axis=0)
    return np.nanmean(matrix, axis=0), low, high, drawn


def importance_table(
    heads: pd.DataFrame,
    logp: np.ndarray | None,
    acc: np.ndarray | None,
    attribution: np.ndarray | None = None,
    *,
    draws: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Return importance.csv: per head its RAM and RAM rank (from `heads`, a rank run's table), the mean drops
    with 95 % intervals, and the causal rank (1 = largest mean drop of the answer's log p, ties to the earlier
    (layer, head)) with its bounds. The causal effect (`effect`) is the exact drop where measured, else the
    attribution estimate.

    Examples:
        >>> heads = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "mass": [0.5, 0.1, 0.3], "rank": [1, 3, 2]})
        >>> drop = np.array([[0.1, 2.0, 0.5], [0.3, 2.2, 0.4]])
        >>> t = importance_table(heads, drop, np.zeros((2, 3)), draws=200)
        >>> t[["layer", "head", "ram_rank", "effect", "causal_rank", "rank_diff"]]
           layer  head  ram_rank  effect  causal_rank  rank_diff
        0      0     0         1    0.20            3         -2
        1      0     1         3    2.10            1          2
        2      1     0         2    0.45            2          0
    """
    grid = heads.sort_values(["layer", "head"]).reset_index(drop=True)
    effect_matrix = logp if logp is not None else attribution
    if effect_matrix is None:
        raise CorelensError("importance needs exact or attribution effects")
    if effect_matrix.shape[1] != len(grid):
        raise CorelensError(f"{effect_matrix.shape[1]} effects per sample for {len(grid)} ranked heads")
    table = pd.DataFrame({"layer": grid["layer"], "head": grid["head"], "ram": grid["mass"]})
    table["ram_rank"] = grid["rank"].astype(int)
    nan = np.full(len(grid), np.nan)
    effect_draws = None
    for name, matrix, offset in (
        ("drop_logp", logp, 0),
        ("drop_acc", acc, 1),
        ("attribution", attribution, 2),
    ):
        mean, low, high, drawn = _mean_interval(matrix, draws, seed + offset)
        table[name] = nan if mean is None else mean
        table[f"{name}_low"] = nan if low is None else low
        table[f"{name}_high"] = nan if high is None else high
        if matrix is effect_matrix and effect_draws is None:
            effect_draws = drawn
    table["effect"] = table["drop_logp" if logp is not None else "attribution"]
    rank = ranks_of(table["effect"].to_numpy())
    low, high = rank_bounds(effect_draws, rank)
    table["causal_rank"], table["causal_rank_low"], table["causal_rank_high"] = rank, low, high
    table["rank_diff"] = table["ram_rank"] - table["causal_rank"]
    table["n"] = len(effect_matrix)
    return table[COLUMNS]


def agreement(
    table: pd.DataFrame, effects: np.ndarray, ram: np.ndarray | None, *, draws: int = 1000, seed: int = 0
) -> dict:
    """Return the Spearman of RAM and the causal effect over heads, its 95 % interval, and the heads where
    the two ranks differ most.

    `effects` is the (samples, heads) matrix behind `table`'s `effect`; `ram` the rank run's (samples, heads)
    RAM matrix (`rank_agreement.sample_matrix` of its ram.parquet): both are drawn from their posteriors
    (`spearman_interval`). Without `ram` the RAM means are held fixed and only the effects are drawn
    (percentile interval; `interval` says which).
    """
    rho = float(stats.spearmanr(table["ram"], table["effect"]).statistic)
    if ram is not None and len(ram) > 1 and len(effects) > 1:
        low, high = (float(x) for x in spearman_interval(ram, effects, draws, seed))
        how = "posterior draws of RAM and effect (spearman_interval)"
    elif len(effects) > 1:
        drawn = spearman_rows(table["ram"].to_numpy()[None], posterior_means(effects, draws, seed))
        low, high = (float(x) for x in np.nanquantile(drawn, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]))
        how = "posterior draws of the effect, RAM means held fixed (no ram.parquet beside heads.csv)"
    else:
        low = high = float("nan")
        how = "none (one sample)"
    order = table.assign(gap=table["rank_diff"].abs()).sort_values(
        ["gap", "causal_rank"], ascending=[False, True], kind="stable"
    )
    disagree = [
        {
            "head": f"L{int(r.layer)}H{int(r['head'])}",
            "ram_rank": int(r.ram_rank),
            "causal_rank": int(r.causal_rank),
        }
        for _, r in order.head(DISAGREE).iterrows()
    ]
    return {
        "spearman": rho,
        "low": low,
        "high": high,
        "interval": how,
        "heads": len(table),
        "disagree": disagree,
    }


def estimator_agreement(exact: np.ndarray, attribution: np.ndarray) -> dict:
    """Return how well attribution patching tracks the exact single-head effects: Spearman and Pearson of the
    per-head means, and Spearman over every (sample, head) pair."""
    a, b = np.nanmean(exact, axis=0), np.nanmean(attribution, axis=0)
    return {
        "spearman_heads": float(stats.spearmanr(a, b).statistic),
        "pearson_heads": float(stats.pearsonr(a, b).statistic),
        "spearman_pairs": float(stats.spearmanr(exact.ravel(), attribution.ravel()).statistic),
    }
