"""Figures of head topology: the cross-run Spearman matrix and depth profiles of several runs on one axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from corelens.metrics.rank_agreement import square
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


MARKERS = ("o", "s", "^", "D", "v", "P")
LINES = ("-", "--", "-.", ":")


def coinciding(depth: pd.DataFrame) -> list[list[str]]:
    """Return the groups of runs (two or more) whose depth profiles are identical, each in plotting order.

    Examples:
        >>> d = pd.DataFrame({"run": ["a", "a", "b", "b", "c", "c"], "depth": [0.5, 1] * 3,
        ...                   "core_share": [0, 1, 0, 1, 1, 0]})
        >>> coinciding(d)
        [['a', 'b']]
    """
    groups: dict[tuple, list[str]] = {}
    for label, part in depth.groupby("run", sort=False):
        key = tuple(zip(part["depth"].round(9), part["core_share"].round(9)))
        groups.setdefault(key, []).append(str(label))
    return [g for g in groups.values() if len(g) > 1]


def depth_plot(depth: pd.DataFrame) -> plt.Figure:
    """Return the depth-profile figure of `depth_figure` (not saved: tests read its artists).

    Each run has its own marker and line style and is shifted sideways by a hair, so that runs with the same
    profile stay visible; a note under the legend names the runs whose lines coincide.
    """
    fig, ax = plt.subplots(figsize=(6.0, 3.8), layout="constrained")
    labels = [str(label) for label in depth["run"].drop_duplicates()]
    step = 0.008 * (1 if len(labels) < 2 else min(1.0, 4 / len(labels)))
    for i, (label, part) in enumerate(depth.groupby("run", sort=False)):
        shift = (i - (len(labels) - 1) / 2) * step
        ax.plot(
            part["depth"] + shift,
            part["core_share"],
            marker=MARKERS[i % len(MARKERS)],
            ls=LINES[i % len(LINES)],
            markerfacecolor="none" if i % 2 else None,
            label=str(label),
        )
    same = coinciding(depth)
    note = "; ".join(" = ".join(g) for g in same)
    ax.set_xlabel("depth fraction l / L")
    ax.set_ylabel("share of CoRe heads in layer")
    ax.set_xlim(0, 1.04)
    ax.set_ylim(bottom=0)
    ax.set_title("Depth profile of the CoRe heads")
    legend = ax.legend(fontsize=8, title=f"coincide: {note}\n(drawn side by side)" if note else None)
    if note:
        legend.get_title().set_fontsize(8)
    ax.grid(alpha=0.3)
    return fig


def depth_figure(depth: pd.DataFrame, path: str | Path) -> Path:
    """Write the share of CoRe heads per layer against depth fraction l / L, one line per run."""
    return save_figure(depth_plot(depth), path)
