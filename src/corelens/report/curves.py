"""Dose-response curves of an ablation sweep: accuracy against the share of heads ablated, per head set."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from corelens.report.figure import plt, save_figure

STYLE = {
    "top": ("tab:red", "o"),
    "bottom": ("tab:blue", "s"),
    "random": ("tab:grey", "^"),
    "layer-matched": ("tab:green", "D"),
}


def dose_response(
    table: pd.DataFrame, path: str | Path, *, total_heads: int, title: str | None = None
) -> Path:
    """Write accuracy vs % of heads ablated (one curve per set) from an ablation table to `path`; return it.

    Seeded sets show the mean over seeds with ±1 sd error bars; deterministic sets (top, bottom) show their
    95 % Wilson interval as a band. Every curve starts at the un-ablated baseline (k = 0), drawn dotted.
    """
    base = table[table["set"] == "none"]
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    x0, y0 = 0.0, None
    if len(base):
        y0 = float(base["accuracy"].iloc[0])
        ax.axhline(
            y0, color="black", lw=0.8, ls=":", label=f"no ablation ({y0:.2f}, n={int(base['n'].iloc[0])})"
        )
    for kind, group in table[table["set"] != "none"].groupby("set", sort=False):
        colour, marker = STYLE.get(kind, (None, "o"))
        stats = (
            group.groupby("k_heads")
            .agg(
                acc=("accuracy", "mean"),
                sd=("accuracy", "std"),
                lo=("ci_low", "mean"),
                hi=("ci_high", "mean"),
            )
            .reset_index()
            .sort_values("k_heads")
        )
        x = 100.0 * stats["k_heads"] / total_heads
        seeds = int(group["seed"].notna().groupby(group["k_heads"]).sum().max())
        if seeds > 1:
            label = f"{kind} (mean ± sd over {seeds} seeds)"
            ax.errorbar(
                x,
                stats["acc"],
                yerr=stats["sd"].fillna(0.0),
                color=colour,
                marker=marker,
                capsize=3,
                label=label,
            )
        else:
            ax.plot(x, stats["acc"], color=colour, marker=marker, label=f"{kind} (band: 95 % CI)")
            ax.fill_between(x, stats["lo"], stats["hi"], color=colour, alpha=0.15, lw=0)
        if y0 is not None:
            ax.plot([x0, x.iloc[0]], [y0, stats["acc"].iloc[0]], color=colour, ls=":", lw=1)
    ax.set_xlabel("heads ablated (% of all layer x head pairs)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(left=0)
    ax.set_title(title or "ablation dose-response")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
