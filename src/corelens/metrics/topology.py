"""Where the retrieval mass sits: sparsity (share of heads holding 50 % / 80 %, Gini) and depth profiles.

docs/methods.md#sparsity-and-depth: functional sparsity and the depth profile of the CoRe heads, per layer and per
depth fraction `l / L` so that models of different depth compare.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from corelens.metrics.ram import top_heads

DEPTH_BINS = 10  # depth fractions are reported in tenths of the model's depth


def mass_shares(values: np.ndarray, shares: tuple[float, ...] = (0.5, 0.8)) -> dict[float, float]:
    """Return, for each share s, the smallest fraction of heads whose summed value reaches s of the total."""
    v = np.sort(np.clip(np.asarray(values, dtype=np.float64), 0.0, None))[::-1]
    total = v.sum()
    if total <= 0:
        return dict.fromkeys(shares, float("nan"))
    cumulative = np.cumsum(v) / total
    return {s: float((np.searchsorted(cumulative, s - 1e-12) + 1) / len(v)) for s in shares}


def gini(values: np.ndarray) -> float:
    """Return the Gini coefficient of non-negative values (0 = all equal, → 1 = one head holds all).

    Examples:
        >>> gini([1, 1, 1, 1]), gini([0, 0, 0, 4])  # one of n heads holding all gives 1 - 1/n
        (0.0, 0.75)
    """
    v = np.sort(np.clip(np.asarray(values, dtype=np.float64), 0.0, None))
    n, total = len(v), v.sum()
    if n == 0 or total <= 0:
        return float("nan")
    return float((2 * np.arange(1, n + 1) - n - 1) @ v / (n * total))


def sparsity(heads: pd.DataFrame, value: str = "mass") -> dict[str, float]:
    """Return the shares of heads holding 50 % and 80 % of the total `value`, and its Gini coefficient.

    Examples:
        >>> heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
        ...                       "mass": [0.6, 0.2, 0.1, 0.1], "rank": [1, 2, 3, 4]})
        >>> {name: round(v, 2) for name, v in sparsity(heads).items()}
        {'heads_for_50pct': 0.25, 'heads_for_80pct': 0.5, 'gini': 0.4}
    """
    values = heads[value].to_numpy(np.float64)
    shares = mass_shares(values)
    return {"heads_for_50pct": shares[0.5], "heads_for_80pct": shares[0.8], "gini": gini(values)}


def depth_profile(heads: pd.DataFrame, k: int | float, num_layers: int | None = None) -> pd.DataFrame:
    """Return per layer: its depth fraction, the number of top-`k` heads in it and its mean `mass`.

    Examples:
        >>> heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
        ...                       "mass": [0.6, 0.2, 0.1, 0.1], "rank": [1, 2, 3, 4]})
        >>> depth_profile(heads, 2)
           layer  depth  core_heads  core_share  mean_mass
        0      0    0.5           2         1.0        0.4
        1      1    1.0           0         0.0        0.1
    """
    layers = int(num_layers if num_layers is not None else heads["layer"].max() + 1)
    core = pd.Series([layer for layer, _ in top_heads(heads, k)], dtype=np.int64)
    count = core.value_counts().reindex(range(layers), fill_value=0)
    mean = heads.groupby("layer")["mass"].mean().reindex(range(layers))
    return pd.DataFrame(
        {
            "layer": np.arange(layers),
            "depth": (np.arange(layers) + 1) / layers,
            "core_heads": count.to_numpy(),
            "core_share": count.to_numpy() / max(1, len(core)),
            "mean_mass": mean.to_numpy(),
        }
    )


def depth_bins(profile: pd.DataFrame, bins: int = DEPTH_BINS) -> pd.DataFrame:
    """Return the share of CoRe heads per depth bin ((0, 0.1], (0.1, 0.2], ...) of a `depth_profile`."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.ceil(profile["depth"].to_numpy() * bins - 1e-9).astype(int) - 1, 0, bins - 1)
    share = np.bincount(index, weights=profile["core_share"].to_numpy(), minlength=bins)
    return pd.DataFrame({"depth_low": edges[:-1], "depth_high": edges[1:], "core_share": share})
