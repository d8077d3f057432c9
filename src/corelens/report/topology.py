"""Figures of head topology: the cross-run Spearman matrix and depth profiles of several runs on one axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from corelens.metrics.stability import square
from corelens.report.figure import plt, save_figure


def spearman_figure(pairs: pd.DataFrame, labels: list[str], path: str | Path) -> Path:
    """Write the label x label Spearman matrix, each cell annotated with rho and its 95 % interval."""
    rho = square(pairs, labels, "spearman")
    low, high = square(pairs, labels, "low"), square(pairs, labels, "high")
    size = 1.4 * len(labels) + 2.2
    fig, ax = plt.subplots(figsize=(size, size * 0.85))
    image = ax.imshow(rho.to_numpy(float), vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for i in range(len(labels)):
        for j in range(len(labels)):
            text = f"{rho.iat[i, j]:.2f}"
            if i != j and np.isfinite(low.iat[i, j]):
                text += f"\n[{low.iat[i, j]:.2f}, {high.iat[i, j]:.2f}]"
            dark = abs(rho.iat[i, j]) > 0.6  # white text on the saturated end of the colour map
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax.set_title("Spearman of per-head mean RAM (95 % bootstrap CI)")
    fig.colorbar(image, ax=ax, label="Spearman rho", shrink=0.8)
    return save_figure(fig, path)


def depth_figure(depth: pd.DataFrame, path: str | Path) -> Path:
    """Write the share of CoRe heads per layer against depth fraction l / L, one line per run."""
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for label, part in depth.groupby("run", sort=False):
        ax.plot(part["depth"], part["core_share"], marker="o", label=str(label))
    ax.set_xlabel("depth fraction l / L")
    ax.set_ylabel("share of CoRe heads in layer")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(bottom=0)
    ax.set_title("Depth profile of the CoRe heads")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
