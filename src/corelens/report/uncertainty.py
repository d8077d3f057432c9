"""Stability curve figure: expected top-k Jaccard and Spearman of two disjoint n-sample rankings against n."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from corelens.report.figure import plt, save_figure


def curve_figure(curve: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """Write the stability curve (one Jaccard line per k, one Spearman line; 5-95 % bands) to `path`."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.8), sharex=True)
    for k, part in curve.groupby("k"):
        left.plot(part["n"], part["jaccard"], marker="o", ms=3, label=f"top-{k}")
        left.fill_between(part["n"], part["jaccard_p05"], part["jaccard_p95"], alpha=0.15)
    spearman = curve.drop_duplicates("n")
    right.plot(spearman["n"], spearman["spearman"], marker="o", ms=3, color="black")
    right.fill_between(spearman["n"], spearman["spearman_p05"], spearman["spearman_p95"], alpha=0.15)
    for ax, label in ((left, "top-k Jaccard"), (right, "Spearman of head means")):
        ax.axhline(0.9, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("samples per ranking (n)")
        ax.set_ylabel(label)
        ax.set_ylim(min(0.0, float(ax.get_ylim()[0])), 1.02)
    left.legend(fontsize=8)
    fig.suptitle(title or "two disjoint n-sample rankings: mean and 5-95 % over pairs", fontsize=10)
    return save_figure(fig, path)
