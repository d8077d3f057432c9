"""How sure is a head ranking: intervals of mass and rank per head, P(top-k), stability against sample size.

Every function reads the per-sample long RAM table (`metrics.ram.sample_frame`, a run's `ram.parquet`).
Intervals and P(top-k) come from posterior draws of the per-head means (`metrics.posterior`: a Bayesian
bootstrap with one pooled prior pseudo-sample, docs/methods.md "Ranking uncertainty"; P(top-k) after an
empirical-Bayes shrinkage of those draws across heads); ranking resamples and
the stability curve resample the samples themselves. A bootstrap resample is a vector of multinomial counts
over the n samples, so the resampled per-head means of B resamples are one matrix product (B x n counts) @
(n x heads values) / n. Ranks follow `metrics.ram.head_table`: 1 = highest mean, ties broken by (layer, head).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from corelens.errors import CorelensError
from corelens.metrics.posterior import posterior_means, shrunk_means
from corelens.metrics.ram import head_table
from corelens.metrics.rank_agreement import sample_matrix

LEVEL = 0.95  # two-sided level of the mass and rank intervals
UNCERTAIN = (0.2, 0.8)  # a head whose P(top-k) lies strictly inside is marked uncertain


def boot_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """Return (n_boot, n) multinomial counts: how often each of n samples is drawn in each resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)


def ranks_of(means: np.ndarray) -> np.ndarray:
    """Return the ranks (1 = highest) along the last axis; ties go to the earlier (layer, head)."""
    return stats.rankdata(-means, method="ordinal", axis=-1)


def p_column(count: int) -> str:
    """Return the heads.csv column of P(head in the top `count`)."""
    return f"p_top{count}"


def rank_bounds(draws: np.ndarray, rank: np.ndarray, level: float = LEVEL, chunk: int = 2**24) -> tuple:
    """Return (low, high) rank bounds per head from (..., draws, heads) posterior draws of the means.

    Head j counts as above head i when at least `level` of the draws put j's mean above i's (below: the same
    the other way); low = 1 + heads above, high = heads - heads below. Each bound then takes in `rank`, the
    full-data rank, so that low <= rank <= high. Pairs are compared in blocks of about `chunk` cells.

    Examples:
        >>> draws = np.array([[3.0, 2.0, 1.0], [3.0, 1.0, 2.0], [3.0, 2.0, 1.5]])  # head 0 always first
        >>> rank_bounds(draws, np.array([1, 2, 3]), level=0.9)
        (array([1, 2, 2]), array([1, 3, 3]))
    """
    total, heads = draws.shape[-2:]
    above = np.empty(draws.shape[:-2] + (heads,), int)
    below = np.empty_like(above)
    step = max(1, chunk // max(1, draws.size))  # a block of `step` heads compares draws.size * step pairs
    others = draws[..., None, :]  # (..., draws, 1, heads) against a block of heads (..., draws, block, 1)
    for start in range(0, heads, step):
        block = draws[..., start : start + step, None]
        above[..., start : start + step] = (np.count_nonzero(others > block, axis=-3) / total >= level).sum(
            -1
        )
        below[..., start : start + step] = (np.count_nonzero(others < block, axis=-3) / total >= level).sum(
            -1
        )
    return np.minimum(1 + above, rank), np.maximum(heads - below, rank)


def bootstrap_heads(
    ram: pd.DataFrame,
    counts: Sequence[int],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    value: str = "mass",
    level: float = LEVEL,
) -> pd.DataFrame:
    """Return the head table of `ram` with intervals of mean `value` and rank, and P(top-k) per count.

    `n_boot` posterior draws of the per-head means (`posterior.posterior_means`: a Bayesian bootstrap with one
    pooled prior pseudo-sample, docs/methods.md#ranking-uncertainty). Columns added: `mass_low`/`mass_high`
    (the central `level` interval of the drawn means), `rank_low`/`rank_high` (`rank_bounds`; low = best) and
    one `p_top{k}` per count: the share of the draws shrunk by `posterior.shrunk_means` (an empirical-Bayes
    prior of the means fitted across the heads) in which the head ranks in the top k.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> data = generate("image", getfixture("tmp_path"), 8, seed=1)
        >>> ram = cl.rank(cl.load(organism_path(), device="cpu"), data, query="answer", ks=None).ram
        >>> table = bootstrap_heads(ram, [4], n_boot=200)
        >>> table[["layer", "head", "mass", "mass_low", "mass_high", "rank_low", "rank_high", "p_top4"]].head(4).round(2)
           layer  head  mass  mass_low  mass_high  rank_low  rank_high  p_top4
        0      0     7  0.44      0.24       0.49         1          3    1.00
        1      0     5  0.44      0.23       0.49         1          3    1.00
        2      0     6  0.25      0.12       0.39         1         15    0.72
        3      1     0  0.16      0.05       0.29         3         17    0.26
        >>> table.loc[uncertain_heads(table), ["layer", "head"]].values.tolist()  # 0.2 < P(top-4) < 0.8
        [[0, 6], [1, 0], [3, 0]]
    """
    if n_boot < 1:
        raise CorelensError(f"--n-boot must be at least 1, got {n_boot}")
    table = head_table(ram, value)
    matrix = sample_matrix(ram, value)  # samples x heads, heads in (layer, head) order
    if len(matrix) == 0:
        return table
    means = posterior_means(matrix, n_boot, seed)
    tail = (1 - level) / 2
    grid = table.sort_values(["layer", "head"]).index  # table row of each matrix column
    low, high = rank_bounds(means, table.loc[grid, "rank"].to_numpy(), level)
    extra = {
        f"{value}_low": np.quantile(means, tail, axis=0),
        f"{value}_high": np.quantile(means, 1 - tail, axis=0),
        "rank_low": low,
        "rank_high": high,
    }
    shrunk = ranks_of(shrunk_means(means, matrix))  # P(top-k) from the empirical-Bayes draws
    for count in sorted(set(counts)):
        extra[p_column(count)] = (shrunk <= count).mean(axis=0)
    for column, values in extra.items():
        table.loc[grid, column] = values
    return table.astype({"rank_low": int, "rank_high": int})


def uncertain_heads(table: pd.DataFrame, band: tuple[float, float] = UNCERTAIN) -> pd.Series:
    """Return a boolean per row: some P(top-k) column lies strictly inside `band`.

    Examples:
        >>> uncertain_heads(pd.DataFrame({"p_top4": [0.99, 0.5, 0.1]})).tolist()
        [False, True, False]
    """
    columns = [c for c in table.columns if c.startswith("p_top")]
    if not columns:
        return pd.Series(False, index=table.index)
    p = table[columns]
    return ((p > band[0]) & (p < band[1])).any(axis=1)


def resampled_tables(ram: pd.DataFrame, r: int, seed: int, *, resample: bool = True) -> list[pd.DataFrame]:
    """Return `r` head tables, each ranked on one bootstrap resample of the samples of `ram`.

    `resample=False` returns the full-data table `r` times: the same path with the resampling taken out.
    """
    if r < 1:
        raise CorelensError(f"--rank-resamples must be at least 1, got {r}")
    base = head_table(ram)
    if not resample:
        return [base.copy() for _ in range(r)]
    matrix = sample_matrix(ram)
    means = boot_counts(len(matrix), r, seed) @ np.nan_to_num(matrix) / len(matrix)
    ranks = ranks_of(means)
    grid = base.sort_values(["layer", "head"])[["layer", "head"]].reset_index(drop=True)
    return [
        grid.assign(mass=means[i], rank=ranks[i]).sort_values("rank").reset_index(drop=True) for i in range(r)
    ]


def _top_sets(ranks: np.ndarray, k: int) -> np.ndarray:
    return ranks <= k  # (..., heads) boolean membership


def stability_curve(
    ram: pd.DataFrame,
    counts: Sequence[int],
    *,
    sizes: Sequence[int] | None = None,
    pairs: int = 200,
    seed: int = 0,
    value: str = "mass",
) -> pd.DataFrame:
    """Return the expected top-k Jaccard and Spearman between two disjoint random n-sample subsets, per n.

    For each n (default: every n from 2 to half the samples, at most 40 values) `pairs` random pairs of
    disjoint subsets are drawn; each subset ranks the heads by its mean `value`. One row per (n, k):
    mean Jaccard of the two top-k sets and its 5-95 % range over pairs, and the same for Spearman of the means.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> data = generate("image", getfixture("tmp_path"), 8, seed=1)
        >>> ram = cl.rank(cl.load(organism_path(), device="cpu"), data, query="answer", ks=None).ram
        >>> curve = stability_curve(ram, [4], pairs=50)
        >>> curve[["n", "k", "jaccard", "jaccard_p05", "jaccard_p95", "spearman"]].round(2)
           n  k  jaccard  jaccard_p05  jaccard_p95  spearman
        0  2  4     0.39         0.33          0.6      0.42
        1  3  4     0.45         0.33          0.6      0.50
        2  4  4     0.48         0.33          0.6      0.56
        >>> first_n(curve, 4, at=0.4), first_n(curve, 4, at=0.9)  # 8 samples never reach 0.9
        (3, None)
    """
    if pairs < 1:
        raise CorelensError(f"--pairs must be at least 1, got {pairs}")
    matrix = np.nan_to_num(sample_matrix(ram, value))
    total = len(matrix)
    if total < 4:
        raise CorelensError(f"a stability curve needs at least 4 ranked samples, the run has {total}")
    if sizes is None:
        sizes = np.unique(np.linspace(2, total // 2, min(40, total // 2 - 1)).round().astype(int))
    sizes = [int(n) for n in sizes if 1 <= n <= total // 2]
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        # One random permutation per pair; subset a = the samples at positions < n, b = positions n..2n-1.
        # Means as (pairs x samples) selection @ (samples x heads): memory grows with pairs x samples only.
        position = np.argsort(np.argsort(rng.random((pairs, total)), axis=1), axis=1)
        a = (position < n) @ matrix / n
        b = ((position >= n) & (position < 2 * n)) @ matrix / n
        ra, rb = ranks_of(a), ranks_of(b)
        # Spearman = Pearson of average ranks; a constant subset (no spread) gives nan.
        sa, sb = stats.rankdata(a, axis=1), stats.rankdata(b, axis=1)
        sa, sb = sa - sa.mean(1, keepdims=True), sb - sb.mean(1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            rho = (sa * sb).sum(1) / np.sqrt((sa**2).sum(1) * (sb**2).sum(1))
        for k in sorted(set(counts)):
            ta, tb = _top_sets(ra, k), _top_sets(rb, k)
            jac = (ta & tb).sum(1) / (ta | tb).sum(1)
            rows.append(
                {
                    "n": n,
                    "k": k,
                    "jaccard": jac.mean(),
                    "jaccard_p05": np.quantile(jac, 0.05),
                    "jaccard_p95": np.quantile(jac, 0.95),
                    "spearman": np.nanmean(rho),
                    "spearman_p05": np.nanquantile(rho, 0.05),
                    "spearman_p95": np.nanquantile(rho, 0.95),
                    "pairs": pairs,
                }
            )
    return pd.DataFrame(rows)


def first_n(curve: pd.DataFrame, k: int, column: str = "jaccard", at: float = 0.9) -> int | None:
    """Return the smallest n from which the curve's `column` stays at or above `at` for top-`k` (None: never).

    Examples:
        >>> curve = pd.DataFrame({"n": [2, 4, 8, 16], "k": 4, "jaccard": [0.5, 0.92, 0.88, 0.95]})
        >>> first_n(curve, 4), first_n(curve, 4, at=0.85)  # the dip at n = 8 resets the first
        (16, 4)
    """
    part = curve[curve["k"] == k].sort_values("n")
    below = part[part[column] < at]
    after = part if below.empty else part[part["n"] > below["n"].max()]
    return int(after["n"].iloc[0]) if len(after) else None


RESAMPLED = "top-resampled"  # the `set` of a top-k condition ranked on one bootstrap resample


def resampled_summary(
    table: pd.DataFrame, by: str, sets: Iterable[tuple[str, tuple]] = (), level: float = 0.9
) -> pd.DataFrame:
    """Return one row per `by` value: the single-ranking top-k accuracy next to the resampled ones.

    `table` is an ablation or hybrid table whose `set` column holds "top" and `RESAMPLED` rows; the result
    gives their median, the central `level` interval (percentiles), min, max and how many resamples; with
    `sets` ((by value, head set) of each resample) also how many distinct head sets they made.
    """
    distinct: dict[str, set] = {}
    for value, heads in sets:
        distinct.setdefault(value, set()).add(tuple(heads))
    rows = []
    tail = (1 - level) / 2
    for value, group in table[table["set"] == RESAMPLED].groupby(by, sort=False):
        acc = group["accuracy"].to_numpy(float)
        single = table.loc[(table["set"] == "top") & (table[by] == value), "accuracy"]
        rows.append(
            {
                by: value,
                "single": float(single.iloc[0]) if len(single) else float("nan"),
                "median": float(np.median(acc)),
                "low": float(np.quantile(acc, tail)),
                "high": float(np.quantile(acc, 1 - tail)),
                "min": float(acc.min()),
                "max": float(acc.max()),
                "resamples": len(acc),
                "distinct_sets": len(distinct[value]) if value in distinct else pd.NA,
            }
        )
    return pd.DataFrame(rows)


def draws_interval(
    correct: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = LEVEL
) -> tuple[float, float]:
    """Return a two-level bootstrap interval of the mean accuracy of a control drawn several times.

    `correct` is (draws, samples) of 0/1 answers, one row per random head set, all on the same samples. Each
    resample draws the head sets with replacement, then the samples with replacement (one sample index per
    column, shared by the resampled draws, since every draw answered the same samples), so the interval takes
    in both the variation between draws and the sampling of questions (docs/methods.md#control-head-sets). Pooling the
    answers of all draws, as a Wilson interval does, counts draws x samples answers as independent and leaves
    the between-draw variation out.

    Examples:
        >>> agree = np.array([[1, 1, 0, 1] * 10] * 5)  # five draws that answer alike
        >>> differ = np.array([[1] * 40, [0] * 40, [1] * 40, [0] * 40, [1] * 40])  # draws decide everything
        >>> low, high = draws_interval(agree); round(high - low, 2) < 0.3
        True
        >>> low, high = draws_interval(differ); bool(low < 0.3 and high > 0.9)
        True
    """
    correct = np.asarray(correct, dtype=np.float64)
    if correct.ndim != 2 or not correct.size:
        raise CorelensError(f"draws_interval needs a (draws, samples) array, got shape {correct.shape}")
    draws, samples = correct.shape
    rng = np.random.default_rng(seed)
    which = rng.integers(0, draws, size=(n_boot, draws))
    cols = rng.integers(0, samples, size=(n_boot, samples))
    # mean over the resampled draws of each resampled draw's mean over the resampled samples, in chunks of
    # resamples so that memory stays near 64 MB whatever the counts
    step = max(1, 2**23 // (draws * samples))
    means = np.concatenate(
        [
            correct[which[i : i + step, :, None], cols[i : i + step, None, :]].mean(axis=(1, 2))
            for i in range(0, n_boot, step)
        ]
    )
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)
