"""Layer x head heatmaps of a per-head table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from corelens.report.figure import plt, save_figure


def head_heatmap(
    heads: pd.DataFrame, path: str | Path, value: str = "mass", title: str | None = None
) -> Path:
    """Write a layer x head heatmap of column `value` of a head table to `path` (PNG); return the path."""
    layers = int(heads["layer"].max()) + 1
    n_heads = int(heads["head"].max()) + 1
    grid = np.full((layers, n_heads), np.nan)
    grid[heads["layer"].to_numpy(int), heads["head"].to_numpy(int)] = heads[value].to_numpy(float)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * n_heads + 2), max(3.0, 0.3 * layers + 1.5)))
    image = ax.imshow(grid, aspect="auto", cmap="viridis", origin="lower", interpolation="nearest")
    ax.set_xlabel("query head")
    ax.set_ylabel("layer")
    ax.set_title(title or f"mean {value} per head")
    fig.colorbar(image, ax=ax, label=value)
    return save_figure(fig, path)
