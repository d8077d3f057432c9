"""Posterior draws of per-head mean RAM: a Bayesian bootstrap with one pooled prior pseudo-sample.

docs/methods.md#ranking-uncertainty. X is the n x H matrix of per-sample RAM (`stability.sample_matrix`). A
draw of the H means is a Dirichlet-process posterior draw: weights (w_0, w_1, ..., w_n) ~ Dirichlet(alpha, 1,
..., 1) and mean_h = w_0 y_h + sum_i w_i X[i, h], where y_h is one value drawn from the pooled per-sample
RAM of all heads of the run (the prior's base measure) and alpha = `PRIOR_WEIGHT` (one pseudo-sample).
The samples' weights are shared by all heads, so the draws keep the correlation between heads that the
samples carry; the pseudo-sample keeps a head whose n samples look alike (all 0, or all at one mode of a
bimodal head) from getting a zero-width interval, and its weight, about 1 / (n + 1), vanishes as n grows.
"""

from __future__ import annotations

import numpy as np

PRIOR_WEIGHT = 1.0  # alpha: the prior's weight, in samples
# The smallest sample count from which tests/test_calibration.py finds the mass and rank intervals and
# P(top-k) calibrated (checked at n = 8, 24 and 100); commands that rank on fewer samples warn.
CALIBRATED_FROM = 8
# The same for the cross-task Spearman interval: at n = 8 it covers about 60-85 % (the Spearman of noisy
# means is biased towards 0 by more than the draws show), from n = 24 about 93-96 %.
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
