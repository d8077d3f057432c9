"""Curves of accuracy or agreement against one quantity, one line per head set or k.

`dose_response`: accuracy against the share of heads ablated (an ablation sweep); `accuracy_vs_kept`:
accuracy against the share of heads kept full under hybrid attention; `curve_figure`: the stability curve,
the top-k Jaccard and Spearman of two disjoint n-sample rankings against n.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from corelens.report.figure import label_accuracy, plt, save_figure

STYLE = {
    "top": ("tab:red", "o"),
    "bottom": ("tab:blue", "s"),
    "random": ("tab:grey", "^"),
    "layer-matched": ("tab:green", "D"),
}


def within_01(mean: pd.Series, spread: pd.Series) -> list[pd.Series]:
    """Return (below, above) error-bar lengths of `mean` ± `spread`, cut so that the bars stay in [0, 1].

    Examples:
        >>> below, above = within_01(pd.Series([0.1, 0.9]), pd.Series([0.3, 0.3]))
        >>> below.round(2).tolist(), above.round(2).tolist()
        ([0.1, 0.3], [0.3, 0.1])
    """
    return [spread.clip(upper=mean), spread.clip(upper=1 - mean)]


def dose_response(
    table: pd.DataFrame, path: str | Path, *, total_heads: int, title: str | None = None
) -> Path:
    """Write accuracy vs % of heads ablated (one curve per set) from an ablation table to `path`; return it.

    Seeded sets show the mean over seeds with ±1 sd error bars; deterministic sets (top, bottom) show their
    95 % Wilson interval as a band. Every curve starts at the un-ablated baseline (k = 0), drawn dotted.
    """
    base = table[table["set"] == "none"]
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    x0, y0, right = 0.0, None, 0.0
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
            ax.errorbar(x, stats["acc"], yerr=within_01(stats["acc"], stats["sd"].fillna(0.0)), color=colour,
                        marker=marker, capsize=3, label=label, zorder=3)  # fmt: skip
        elif len(x) == 1:  # one size: a point with its interval, not a band of no width
            err = [(stats["acc"] - stats["lo"]).clip(lower=0), (stats["hi"] - stats["acc"]).clip(lower=0)]
            ax.errorbar(x, stats["acc"], yerr=err, color=colour, marker=marker, capsize=3, ls="none",
                        label=f"{kind} (95 % CI)", zorder=3)  # fmt: skip
        else:
            ax.plot(x, stats["acc"], color=colour, marker=marker, label=f"{kind} (band: 95 % CI)", zorder=3)
            ax.fill_between(x, stats["lo"], stats["hi"], color=colour, alpha=0.15, lw=0)
        right = max(right, float(x.max()))
        if y0 is not None:
            ax.plot([x0, x.iloc[0]], [y0, stats["acc"].iloc[0]], color=colour, ls=":", lw=1)
    label_accuracy(ax, "heads ablated (% of all layer x head pairs)")
    ax.set_xlim(0, 1.15 * right if right > 0 else 1)
    ax.set_title(title or "ablation dose-response")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


KEPT_STYLE = {
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
    right = 0.0
    dense = table[table["set"] == "dense"]
    if len(dense):
        y = float(dense["accuracy"].iloc[0])
        ax.axhline(y, color="black", lw=0.8, ls=":", label=f"dense ({y:.2f}, n={int(dense['n'].iloc[0])})")
    for kind, group in table[table["set"] != "dense"].groupby("set", sort=False):
        colour, marker, label = KEPT_STYLE.get(kind, (None, "o", kind))
        stats = (
            group.groupby("fraction")
            .agg(acc=("accuracy", "mean"), lo=("accuracy", "min"), hi=("accuracy", "max"),
                 ci_lo=("ci_low", "mean"), ci_hi=("ci_high", "mean"), draws=("accuracy", "size"))
            .reset_index()
            .sort_values("fraction")
        )  # fmt: skip
        x = 100 * stats["fraction"]
        right = max(right, float(x.max()))
        if int(stats["draws"].max()) > 1:
            # Clipped: a mean of equal accuracies may sit a rounding error outside their min-max.
            err = [(stats["acc"] - stats["lo"]).clip(lower=0), (stats["hi"] - stats["acc"]).clip(lower=0)]
            ax.errorbar(x, stats["acc"], yerr=err, color=colour, marker=marker, capsize=3,
                        label=f"{label} (mean, min-max of {int(stats['draws'].max())} draws)")  # fmt: skip
        elif len(x) == 1:  # one share: a point with its interval (a band of one point draws nothing)
            err = [
                (stats["acc"] - stats["ci_lo"]).clip(lower=0),
                (stats["ci_hi"] - stats["acc"]).clip(lower=0),
            ]
            ax.errorbar(x, stats["acc"], yerr=err, color=colour, marker=marker, capsize=3, ls="none",
                        label=f"{label} (95 % CI)")  # fmt: skip
        else:
            ax.plot(x, stats["acc"], color=colour, marker=marker, label=f"{label} (95 % CI)")
            ax.fill_between(x, stats["ci_lo"], stats["ci_hi"], color=colour, alpha=0.15, lw=0)
    ax.set_xlim(0, min(100.0, 1.3 * right) if right > 0 else 100.0)  # one share: not an axis of 24-26 %
    label_accuracy(ax, "heads kept full (% of all query heads)")
    ax.set_title(title or "hybrid attention: accuracy vs heads kept full", fontsize=9)
    return save_figure(fig, path)


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
