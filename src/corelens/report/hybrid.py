"""Accuracy against the share of heads kept full under hybrid attention, one curve per head set."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from corelens.report.figure import plt, save_figure

STYLE = {
    "top": ("tab:red", "o", "CoRe (top)"),
    "bottom": ("tab:blue", "s", "bottom"),
    "random": ("tab:grey", "^", "random"),
}


def accuracy_vs_kept(table: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """Write accuracy vs % of heads kept full (a hybrid.csv table) to `path` (PNG); return the path.

    Deterministic sets show their 95 % Wilson interval as a band; seeded sets the mean over seeds with the
    min-max range as error bars. The dense model is the dotted line.
    """
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    dense = table[table["set"] == "dense"]
    if len(dense):
        y = float(dense["accuracy"].iloc[0])
        ax.axhline(y, color="black", lw=0.8, ls=":", label=f"dense ({y:.2f}, n={int(dense['n'].iloc[0])})")
    for kind, group in table[table["set"] != "dense"].groupby("set", sort=False):
        colour, marker, label = STYLE.get(kind, (None, "o", kind))
        stats = (
            group.groupby("fraction")
            .agg(acc=("accuracy", "mean"), lo=("accuracy", "min"), hi=("accuracy", "max"),
                 ci_lo=("ci_low", "mean"), ci_hi=("ci_high", "mean"), draws=("accuracy", "size"))
            .reset_index()
            .sort_values("fraction")
        )  # fmt: skip
        x = 100 * stats["fraction"]
        if int(stats["draws"].max()) > 1:
            # Clipped: a mean of equal accuracies may sit a rounding error outside their min-max.
            err = [(stats["acc"] - stats["lo"]).clip(lower=0), (stats["hi"] - stats["acc"]).clip(lower=0)]
            ax.errorbar(x, stats["acc"], yerr=err, color=colour, marker=marker, capsize=3,
                        label=f"{label} (mean, min-max of {int(stats['draws'].max())} draws)")  # fmt: skip
        else:
            ax.plot(x, stats["acc"], color=colour, marker=marker, label=f"{label} (95 % CI)")
            ax.fill_between(x, stats["ci_lo"], stats["ci_hi"], color=colour, alpha=0.15, lw=0)
    ax.set_xlabel("heads kept full (% of all query heads)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or "hybrid attention: accuracy vs heads kept full", fontsize=9)
    ax.legend(fontsize=8, loc="best")
    return save_figure(fig, path)
