"""Cross-task stability of head rankings: Spearman with its interval, top-k Jaccard, universal heads.

docs/methods.md#cross-task-stability. Every input is a long RAM table (`metrics.ram.sample_frame`) of one
task or model; all must rank the same (layer, head) grid. Spearman intervals draw each table's per-head means
from their posterior independently (tables of different tasks hold different samples; `metrics.posterior`).
"""

from __future__ import annotations

import warnings
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from corelens.errors import OptionError
from corelens.metrics.posterior import posterior_means
from corelens.metrics.ram import head_table, top_heads


def sample_matrix(ram: pd.DataFrame, value: str = "mass") -> np.ndarray:
    """Return the (samples, heads) matrix of `value`, heads in (layer, head) order."""
    wide = ram.pivot_table(index="sample_id", columns=["layer", "head"], values=value, aggfunc="mean")
    return wide.sort_index(axis=1).to_numpy(np.float64)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(stats.spearmanr(a, b).statistic)


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the Spearman correlation of each row of `a` with the same row of `b` (nan for a constant row)."""
    ra, rb = stats.rankdata(a, axis=-1), stats.rankdata(b, axis=-1)  # average ranks, as spearmanr
    ra, rb = ra - ra.mean(-1, keepdims=True), rb - rb.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(-1) / np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))


def spearman_interval(ma: np.ndarray, mb: np.ndarray, draws: int, seed: int, level: float = 0.95) -> tuple:
    """Return the `level` interval (low, high) of the Spearman of the true per-head means of two data sets.

    `ma`, `mb`: (..., samples, heads) matrices (leading axes: independent data sets). The Spearman rho of the
    observed means is biased towards 0: sampling noise shuffles heads whose true means are close. Each data
    set's means are drawn from their posterior (`posterior_means`, seeds `seed` and `seed` + 1); the drawn
    Spearman (mean m, quantiles q_low, q_high) carries that noise once more. Taking the attenuation as a
    reliability factor, rho(noise x lambda) = rho / (1 + lambda u) (Spearman's correction for attenuation),
    rho and m give u = (rho / m - 1) / (2 - rho / m) (0 when the draws show no attenuation, at most 1) and
    the corrected Spearman c = (1 + u) rho. The interval is c - (1 + u)(q_high - m) to c + (1 + u)(m - q_low),
    widened to take in the percentile interval [q_low, q_high] and rho itself, clipped to [-1, 1]; nan where
    a mean vector is constant. docs/methods.md#cross-task-stability.
    """
    rho = spearman_rows(ma.mean(-2), mb.mean(-2))
    drawn = spearman_rows(posterior_means(ma, draws, seed), posterior_means(mb, draws, seed + 1))
    tail = (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan draws: a constant head vector
        q_low, q_high = np.nanquantile(drawn, [tail, 1 - tail], axis=-1)
        m = np.nanmean(drawn, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = rho / m
        attenuated = (rho * m > 0) & (ratio > 1)  # the draws lie closer to 0 than rho, on its side
        u = np.clip(np.where(attenuated, (ratio - 1) / np.maximum(2 - ratio, 1e-12), 0.0), 0.0, 1.0)
    scale = 1 + u
    low = np.minimum.reduce([scale * rho - scale * (q_high - m), q_low, rho])
    high = np.maximum.reduce([scale * rho + scale * (m - q_low), q_high, rho])
    return np.clip(low, -1.0, 1.0), np.clip(high, -1.0, 1.0)


def spearman_pairs(
    rams: dict[str, pd.DataFrame], *, value: str = "mass", n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Return one row per pair of tables: Spearman of per-head mean `value` and its 95 % interval.

    The interval comes from `n_boot` posterior draws of each table's means (`spearman_interval`).

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> m, tmp = cl.load(organism_path(), device="cpu"), getfixture("tmp_path")
        >>> rams = {task: cl.rank(m, generate(task, tmp / task, 8, seed=1), query="answer", ks=None).ram
        ...         for task in ("image", "document")}
        >>> spearman_pairs(rams, n_boot=200).round(2)  # 8 samples: below SPEARMAN_CALIBRATED_FROM
               a         b  spearman  low  high  n_a  n_b
        0  image  document       0.2 -0.0  0.42    8    8
    """
    matrices = {label: sample_matrix(ram, value) for label, ram in rams.items()}
    shapes = {label: m.shape[1] for label, m in matrices.items()}
    if len(set(shapes.values())) > 1:
        raise OptionError(f"the runs rank different numbers of heads: {shapes}")
    rows = []
    for a, b in combinations(matrices, 2):
        ma, mb = matrices[a], matrices[b]
        rho = _spearman(ma.mean(0), mb.mean(0))
        low = high = float("nan")
        if n_boot > 0 and len(ma) > 1 and len(mb) > 1:
            low, high = (float(x) for x in spearman_interval(ma, mb, n_boot, seed))
        rows.append(
            {"a": a, "b": b, "spearman": rho, "low": low, "high": high, "n_a": len(ma), "n_b": len(mb)}
        )
    return pd.DataFrame(rows, columns=["a", "b", "spearman", "low", "high", "n_a", "n_b"])


def square(pairs: pd.DataFrame, labels: list[str], column: str) -> pd.DataFrame:
    """Return the symmetric label x label matrix of `column` from a pairs table (1 on the diagonal)."""
    matrix = pd.DataFrame(np.eye(len(labels)), index=labels, columns=labels)
    for row in pairs.itertuples():
        matrix.loc[row.a, row.b] = matrix.loc[row.b, row.a] = getattr(row, column)
    return matrix


def jaccard_pairs(tables: dict[str, pd.DataFrame], k: int | float) -> pd.DataFrame:
    """Return the Jaccard overlap of the top-`k` head sets of every pair of head tables.

    Examples:
        >>> a = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [1, 2, 3, 4]})
        >>> b = a.assign(rank=[2, 1, 4, 3])  # the first two swap, the last two swap
        >>> jaccard_pairs({"a": a, "b": b}, 1)
           a  b  jaccard
        0  a  b      0.0
        >>> jaccard_pairs({"a": a, "b": b}, 2)
           a  b  jaccard
        0  a  b      1.0
    """
    sets = {label: set(top_heads(t, k)) for label, t in tables.items()}
    rows = [
        {"a": a, "b": b, "jaccard": len(sets[a] & sets[b]) / max(1, len(sets[a] | sets[b]))}
        for a, b in combinations(sets, 2)
    ]
    return pd.DataFrame(rows, columns=["a", "b", "jaccard"])


def universal_heads(tables: dict[str, pd.DataFrame], k: int | float) -> list[tuple[int, int]]:
    """Return the heads in the top-`k` of every head table, sorted by (layer, head).

    Examples:
        >>> a = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [1, 2, 3, 4]})
        >>> b = a.assign(rank=[2, 1, 4, 3])  # the first two swap, the last two swap
        >>> universal_heads({"a": a, "b": b}, 1), universal_heads({"a": a, "b": b}, 2)
        ([], [(0, 0), (0, 1)])
    """
    sets = [set(top_heads(t, k)) for t in tables.values()]
    return sorted(set.intersection(*sets)) if sets else []


def aggregate_ranking(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Return one row per head: its rank in each table, the mean rank, and `rank` by mean rank (1 = best).

    Examples:
        >>> a = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [1, 2, 3, 4]})
        >>> b = a.assign(rank=[2, 1, 4, 3])  # the first two swap, the last two swap
        >>> aggregate_ranking({"a": a, "b": b})  # ties in mean rank go to the earlier (layer, head)
           layer  head  rank_a  rank_b  mean_rank  rank
        0      0     0       1       2        1.5     1
        1      0     1       2       1        1.5     2
        2      1     0       3       4        3.5     3
        3      1     1       4       3        3.5     4
    """
    merged = None
    for label, table in tables.items():
        part = table[["layer", "head", "rank"]].rename(columns={"rank": f"rank_{label}"})
        merged = part if merged is None else merged.merge(part, on=["layer", "head"], how="inner")
    if merged is None:
        raise OptionError("no head tables to aggregate")
    merged["mean_rank"] = merged[[c for c in merged.columns if c.startswith("rank_")]].mean(axis=1)
    order = np.lexsort(
        (merged["head"].to_numpy(), merged["layer"].to_numpy(), merged["mean_rank"].to_numpy())
    )
    merged = merged.iloc[order].reset_index(drop=True)
    merged["rank"] = np.arange(1, len(merged) + 1)
    return merged


def head_tables(rams: dict[str, pd.DataFrame], by: str = "mass") -> dict[str, pd.DataFrame]:
    """Return the per-head table of each long RAM table."""
    return {label: head_table(ram, by) for label, ram in rams.items()}
