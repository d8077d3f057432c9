"""The frontier figure: hybrid accuracy against the share of the KV cache kept, one curve per method."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from corelens.report.figure import label_accuracy, plt, save_figure

GRADED = ("sink_window", "top")  # the graded columns' stems in frontier.csv (frontier.graded_columns)


def frontier_figure(table: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """Write a frontier.csv table as accuracy vs % of the KV cache kept to `path` (PNG); return the path.

    Each method (and granularity, when several) is a line with its 95 % interval as a band; the random
    control is grey; the dense model is the dotted line and 95 % of it the dashed one. A table with graded
    columns (`frontier --graded`) adds per method and select a dashed curve in the method's colour (a square
    marker for "top"), at the KV share the graded policy kept.
    """
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    if len(table):
        dense = float(table["dense_accuracy"].iloc[0])
        ax.axhline(
            dense, color="black", lw=0.8, ls=":", label=f"dense ({dense:.2f}, n={int(table['n'].max())})"
        )
        ax.axhline(0.95 * dense, color="black", lw=0.6, ls="--", label="95 % of dense")
    several = table["granularity"].nunique() > 1
    drawn: set[str] = set()
    for (method, gran), group in table.groupby(["method", "granularity"], sort=False):
        group = group.sort_values("cache_kept_fraction")
        x = 100 * group["cache_kept_fraction"]
        label = f"{method} ({gran})" if several else method
        colour = "tab:grey" if method == "random" else None
        (line,) = ax.plot(x, group["hybrid_accuracy"], marker="o", color=colour, label=label)
        ax.fill_between(
            x, group["hybrid_ci_low"], group["hybrid_ci_high"], color=line.get_color(), alpha=0.15, lw=0
        )
        for how in GRADED:
            kept, acc = f"graded_{how}_kept", f"graded_{how}_accuracy"
            if kept in group and group[acc].notna().any():
                g = group.dropna(subset=[acc]).sort_values(kept)
                marker = "s" if how == "top" else "^"
                ax.plot(100 * g[kept], g[acc], ls="--", marker=marker, color=line.get_color())
                drawn.add(how)
    for how in sorted(drawn):  # one legend entry per select, in black: the colour says the method
        marker = "s" if how == "top" else "^"
        ax.plot([], [], ls="--", marker=marker, color="black", label=f"graded {how.replace('_', '+')}")
    label_accuracy(
        ax, "KV cache kept (% of a full cache)", "hybrid accuracy" + (" (graded dashed)" if drawn else "")
    )
    if drawn:  # more curves than the plot can hide a legend among
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.set_size_inches(8.0, 4.2)
    ax.set_title(title or "accuracy against KV cache kept", fontsize=9)
    return save_figure(fig, path)
