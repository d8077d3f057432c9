"""Layer x head heatmaps of a per-head table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from corelens.report.figure import plt, save_figure


def head_heatmap(
    heads: pd.DataFrame,
    path: str | Path,
    value: str = "mass",
    title: str | None = None,
    marked: pd.Series | None = None,
) -> Path:
    """Write a layer x head heatmap of column `value` of a head table to `path` (PNG); return the path.

    `marked` (a boolean per row of `heads`) outlines those cells in red: heads of uncertain top-k membership.
    """
    return save_figure(heatmap_figure(heads, value, title, marked), path)


def heatmap_figure(
    heads: pd.DataFrame, value: str = "mass", title: str | None = None, marked: pd.Series | None = None
) -> plt.Figure:
    """Return the figure of `head_heatmap`, not saved: layer 0 at the top, as a table (and the explorer's grid)
    reads, rows labelled L0, L1, ...

    Examples:
        >>> heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "mass": [0.1, 0.2, 0.3, 0.4]})
        >>> ax = heatmap_figure(heads).axes[0]
        >>> bool(ax.yaxis_inverted()), [t.get_text() for t in ax.get_yticklabels()]
        (True, ['L0', 'L1'])
        >>> plt.close("all")
    """
    layers = int(heads["layer"].max()) + 1
    n_heads = int(heads["head"].max()) + 1
    grid = np.full((layers, n_heads), np.nan)
    grid[heads["layer"].to_numpy(int), heads["head"].to_numpy(int)] = heads[value].to_numpy(float)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * n_heads + 2), max(3.0, 0.3 * layers + 1.5)))
    image = ax.imshow(grid, aspect="auto", cmap="viridis", origin="upper", interpolation="nearest")
    ax.set_yticks(range(layers), [f"L{layer}" for layer in range(layers)])
    ax.set_xlabel("query head")
    ax.set_ylabel("layer (L0 at the top)")
    ax.set_title(title or f"mean {value} per head")
    fig.colorbar(image, ax=ax, label=value)
    if marked is not None and marked.any():
        for layer, head in heads.loc[marked.to_numpy(bool), ["layer", "head"]].to_numpy(int):
            ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, ec="red", lw=2))
        ax.set_xlabel("query head (red outline: 0.2 < P(top-k) < 0.8 for some k)")
    return fig
