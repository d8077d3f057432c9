"""Posterior draws of per-head mean RAM: a Bayesian bootstrap with one pooled prior pseudo-sample.

docs/methods.md#ranking-uncertainty. X is the n x H matrix of per-sample RAM (`rank_agreement.sample_matrix`). A
draw of the H means is a Dirichlet-process posterior draw: weights (w_0, w_1, ..., w_n) ~ Dirichlet(alpha, 1,
..., 1) and mean_h = w_0 y_h + sum_i w_i X[i, h], where y_h is one value drawn from the pooled per-sample
RAM of all heads of the run (the prior's base measure) and alpha = `PRIOR_WEIGHT` (one pseudo-sample).
The samples' weights are shared by all heads, so the draws keep the correlation between heads that the
samples carry; the pseudo-sample keeps a head whose n samples look alike (all 0, or all at one mode of a
bimodal head) from getting a zero-width interval, and its weight, about 1 / (n + 1), vanishes as n grows.

P(top-k) is read from `shrunk_means`: the same draws carried, head by head, onto an empirical-Bayes posterior
whose prior G of the per-head means is fitted across the heads of the run (docs/methods.md, "Shrinkage
for P(top-k)"); heads whose means the data cannot tell apart are drawn as alike as the data say they are.
"""

from __future__ import annotations

import numpy as np
from scipy import special

PRIOR_WEIGHT = 1.0  # alpha: the prior's weight, in samples
# The smallest sample count from which tests/test_calibration.py finds the mass and rank intervals and
# P(top-k) calibrated (checked at n = 8, 24 and 100); commands that rank on fewer samples warn.
CALIBRATED_FROM = 8
# The same for the cross-task Spearman interval: at n = 8 it covers about 84-85 % (the Spearman of noisy
# means is biased towards 0 by more than the draws show), from n = 24 about 93-95 %. Formed from the shrunk
# draws (`shrunk_means`) it covers 95 % at n = 8 but 98-99.6 % at n = 24 and 100, so it stays on the
# unshrunk ones.
SPEARMAN_CALIBRATED_FROM = 24


def posterior_means(
    matrix: np.ndarray, draws: int, seed: int, prior_weight: float = PRIOR_WEIGHT
) -> np.ndarray:
    """Return (..., draws, heads) posterior draws of the per-head means of a (..., samples, heads) `matrix`.

    Leading axes are independent data sets (the calibration test draws many at once); NaN cells count as 0
    (a head without a value in a sample, as in the ranking's input).

    Examples:
        >>> draws = posterior_means(np.array([[0.5, 0.0], [0.5, 0.0], [0.5, 0.1]]), 2000, seed=0)
        >>> draws.shape, bool(draws[:, 0].std() > 0)  # three equal samples: the interval is not a point
        ((2000, 2), True)
        >>> np.quantile(draws[:, 0], [0.025, 0.975]).round(2).tolist()  # the pseudo-sample may be 0 or 0.1
        [0.2, 0.5]
    """
    rng = np.random.default_rng(seed)
    values = np.nan_to_num(np.asarray(matrix, np.float64))
    *batch, n, heads = values.shape
    weights = rng.gamma(1.0, size=(*batch, draws, n))  # normalised Gamma(1) = Dirichlet(1, ..., 1)
    prior = rng.gamma(prior_weight, size=(*batch, draws, 1))
    pooled = values.reshape(*batch, n * heads)
    pick = rng.integers(0, n * heads, size=(*batch, draws * heads))
    pseudo = np.take_along_axis(pooled, pick, axis=-1).reshape(*batch, draws, heads)
    return (weights @ values + prior * pseudo) / (weights.sum(-1, keepdims=True) + prior)


PRIOR_CELLS = 120  # cells of the histogram prior G, spread over the range of the draws
PRIOR_ITERATIONS = 50  # EM steps from the flat histogram (early stopping keeps G smooth)
PRIOR_HEADS = 1.0  # G's own prior: one pseudo-head spread evenly over the range (no cell reaches 0)


def fit_prior(center: np.ndarray, se: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Return (..., heads, cells) cell probabilities of each head's mean: the EB posterior on a histogram prior.

    `center` and `se` (..., heads): each head's observed mean and its standard error; `edges` (..., 1, cells
    + 1). The likelihood of a cell is the chance that a mean uniform in it lies within the normal error of
    the observed one; G (the cells' weights) is the maximum of the marginal likelihood over all heads, found
    by `PRIOR_ITERATIONS` EM steps from the flat histogram, with `PRIOR_HEADS` pseudo-head spread evenly.
    """
    like = np.diff(special.ndtr((edges - center[..., None]) / se[..., None]), axis=-1)
    like = np.maximum(like, 1e-300)  # a cell far from the observed mean: negligible, never exactly 0
    cells, heads = like.shape[-1], like.shape[-2]
    prior = np.full(like.shape[:-2] + (1, cells), 1.0 / cells)
    for _ in range(PRIOR_ITERATIONS):
        post = prior * like
        post /= post.sum(-1, keepdims=True)
        prior = (post.sum(-2, keepdims=True) + PRIOR_HEADS / cells) / (heads + PRIOR_HEADS)
    post = prior * like
    return post / post.sum(-1, keepdims=True)


def shrunk_means(draws: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Return (..., draws, heads) empirical-Bayes draws of the per-head means, one per draw of `draws`.

    `draws` (..., draws, heads) from `posterior_means` on the (..., samples, heads) `matrix`. Each head's
    mean is observed with the normal error se_h = sd of its draws x sqrt((n + 1) / (n - 1)) (the Bayesian
    bootstrap's spread is sum (x - mean)^2 / (n (n + 1)), the unbiased one divides by n (n - 1)). The heads'
    posteriors under the fitted prior (`fit_prior`) are then sampled by each draw's own quantile: a draw at
    the q-th quantile of head h's draws becomes the q-th quantile of h's shrunk posterior (inside a cell the
    posterior is the normal error truncated to the cell), so the draws keep the correlation between heads
    that shared samples give. docs/methods.md#ranking-uncertainty.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> x = np.column_stack([rng.normal(0.8, 0.05, 24), rng.normal(0.1, 0.2, (24, 6)).clip(0)])
        >>> draws = posterior_means(x, 400, seed=1)
        >>> shrunk = shrunk_means(draws, x)
        >>> bool(shrunk[:, 1:].mean(0).std() < draws[:, 1:].mean(0).std())  # the six alike heads: drawn closer
        True
        >>> bool(abs(shrunk[:, 0].mean() - x[:, 0].mean()) < 0.02)  # the head apart keeps its mean
        True
    """
    values = np.nan_to_num(np.asarray(matrix, np.float64))
    n, total = values.shape[-2], draws.shape[-2]
    center = values.mean(-2)
    se = np.maximum(draws.std(-2) * np.sqrt((n + 1) / max(n - 1, 1)), 1e-12)
    low = np.minimum(draws.min(-2), center).min(-1)[..., None, None]
    high = np.maximum(draws.max(-2), center).max(-1)[..., None, None]
    edges = low + (np.maximum(high - low, 1e-12)) * np.linspace(0.0, 1.0, PRIOR_CELLS + 1)
    post = fit_prior(center, se, edges)  # (..., heads, cells)
    # Each draw's quantile within its head, then the posterior's cell that holds that quantile.
    order = np.argsort(np.swapaxes(draws, -1, -2), axis=-1)
    q = np.empty(order.shape)
    np.put_along_axis(q, order, (np.arange(total) + 0.5) / total, axis=-1)
    cdf = np.cumsum(post, -1)
    cell = _cells_at(cdf, q)  # (..., heads, draws)
    mass = np.take_along_axis(post, cell, -1)
    share = np.clip((q - np.take_along_axis(cdf, cell, -1) + mass) / np.maximum(mass, 1e-300), 0.0, 1.0)
    edge = np.broadcast_to(edges, post.shape[:-1] + (PRIOR_CELLS + 1,))
    left, right = np.take_along_axis(edge, cell, -1), np.take_along_axis(edge, cell + 1, -1)
    mu, sd = center[..., None], se[..., None]
    # Inside the cell the posterior is the normal error truncated to it: invert its distribution function.
    a, b = special.ndtr((left - mu) / sd), special.ndtr((right - mu) / sd)
    inside = mu + sd * special.ndtri(np.clip(a + share * (b - a), 1e-300, 1 - 1e-16))
    return np.swapaxes(np.clip(inside, left, right), -1, -2)


def _cells_at(cdf: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Return, per row, the first cell whose cumulative probability `cdf` reaches each quantile of `q`."""
    cells, rows = cdf.shape[-1], cdf.reshape(-1, cdf.shape[-1]).shape[0]
    offset = 2.0 * np.arange(rows)[:, None]  # rows apart: one sorted search over all rows at once
    found = np.searchsorted(
        (cdf.reshape(rows, cells) + offset).ravel(), (q.reshape(rows, -1) + offset).ravel()
    )
    found = found.reshape(rows, -1) - cells * np.arange(rows)[:, None]
    return np.minimum(found, cells - 1).reshape(q.shape)


def few_samples(
    samples: int,
    what: str = "ranking",
    intervals: str = "intervals and P(top-k)",
    calibrated_from: int = CALIBRATED_FROM,
) -> str | None:
    """Return the warning for a `what` resting on fewer samples than its `intervals` are calibrated for, else None.

    Examples:
        >>> few_samples(5)
        'the ranking rests on 5 samples; its intervals and P(top-k) are calibrated from 8 samples up (docs/methods.md#ranking-uncertainty)'
        >>> few_samples(8) is None
        True
    """
    if samples >= calibrated_from:
        return None  # coverage established at this size (tests/test_calibration.py)
    return (
        f"the {what} rests on {samples} samples; its {intervals} are calibrated from "
        f"{calibrated_from} samples up (docs/methods.md#ranking-uncertainty)"
    )
