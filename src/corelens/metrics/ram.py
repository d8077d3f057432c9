"""RAM tables: per-sample long format and the per-head ranking (docs/methods.md#ram)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

RAM_COLUMNS = ("sample_id", "task", "layer", "head", "mass", "share", "lift", "n_omega", "n_visual")


def sample_frame(records: Iterable[dict]) -> pd.DataFrame:
    """Return the long table (one row per sample, layer and head) from logged rank records."""
    frames = []
    for r in records:
        mass = np.asarray(r["mass"], dtype=np.float64)
        layers, heads = mass.shape
        layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        frames.append(
            pd.DataFrame(
                {
                    "sample_id": r["id"],
                    "task": r["task"],
                    "layer": layer.ravel(),
                    "head": head.ravel(),
                    "mass": mass.ravel(),
                    "share": np.asarray(r["share"], dtype=np.float64).ravel(),
                    "lift": np.asarray(r["lift"], dtype=np.float64).ravel(),
                    "n_omega": r["n_omega"],
                    "n_visual": r["n_visual"],
                }
            )
        )
    if not frames:
        return pd.DataFrame({c: [] for c in RAM_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def head_table(ram: pd.DataFrame, by: str = "mass") -> pd.DataFrame:
    """Return one row per (layer, head): means over samples and `rank` (1 = highest mean `by`)."""
    table = (
        ram.groupby(["layer", "head"], sort=True)
        .agg(mass=("mass", "mean"), share=("share", "mean"), lift=("lift", "mean"), n=("mass", "size"))
        .reset_index()
    )
    # Ties broken by (layer, head) so the ranking is deterministic.
    order = np.lexsort((table["head"].to_numpy(), table["layer"].to_numpy(), -table[by].to_numpy()))
    table["rank"] = 0
    table.loc[table.index[order], "rank"] = np.arange(1, len(table) + 1)
    return table.sort_values("rank").reset_index(drop=True)


def top_heads(heads: pd.DataFrame, k: int | float) -> list[tuple[int, int]]:
    """Return the top `k` (layer, head) pairs of a head table; a float in (0, 1) is a fraction of all heads."""
    count = round(k * len(heads)) if isinstance(k, float) and 0 < k < 1 else int(k)
    best = heads.sort_values("rank").head(max(count, 0))
    return list(zip(best["layer"].astype(int), best["head"].astype(int)))
