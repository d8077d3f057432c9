"""RAM against causal importance: one point per head, its effect's 95 % interval, the telling heads labelled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from corelens.report.figure import plt, save_figure

LABELLED = 4  # heads labelled from each end: top RAM, top causal, and the most disagreeing


def labelled_heads(table: pd.DataFrame, disagree: list[dict]) -> list[int]:
    """Return the rows to label: the top `LABELLED` by RAM, by causal effect, and the most disagreeing heads."""
    names = {f"L{int(r.layer)}H{int(r['head'])}": i for i, r in table.iterrows()}
    rows = list(table.nsmallest(LABELLED, "ram_rank").index) + list(
        table.nsmallest(LABELLED, "causal_rank").index
    )
    rows += [names[d["head"]] for d in disagree[:LABELLED] if d["head"] in names]
    return list(dict.fromkeys(rows))


def ram_vs_causal(table: pd.DataFrame, path: str | Path, summary: dict, *, title: str = "") -> Path:
    """Write the scatter of RAM (x) against the mean log-p drop (y) of every head to `path`; return it.

    Labels sit inside the axes: each is offset towards the plot's centre from its point.
    """
    fig, ax = plt.subplots(figsize=(6.0, 4.4))
    x, y = table["ram"].to_numpy(float), table["effect"].to_numpy(float)
    low = table["drop_logp_low" if summary.get("effect") == "exact" else "attribution_low"].to_numpy(float)
    high = table["drop_logp_high" if summary.get("effect") == "exact" else "attribution_high"].to_numpy(float)
    yerr = np.vstack([np.clip(y - low, 0, None), np.clip(high - y, 0, None)])
    ax.errorbar(x, y, yerr=yerr, fmt="o", ms=4, color="tab:blue", ecolor="tab:blue", alpha=0.7, lw=0.8,
                label="head (bar: 95 % interval)")  # fmt: skip
    ax.axhline(0.0, color="black", lw=0.6, ls=":")
    mid_x = (np.nanmin(x) + np.nanmax(x)) / 2 if len(x) else 0.0
    mid_y = (np.nanmin(y) + np.nanmax(y)) / 2 if len(y) else 0.0
    shown = sorted(labelled_heads(table, summary.get("disagree", [])), key=lambda i: table.loc[i, "ram"])
    for k, i in enumerate(shown):
        r = table.loc[i]
        right, up = r["ram"] > mid_x, r["effect"] > mid_y
        lift = 6 + 11 * (k % 3)  # neighbours along x take three heights, so that close labels do not overlap
        ax.annotate(
            f"L{int(r.layer)}H{int(r['head'])}", (r["ram"], r["effect"]), textcoords="offset points",
            xytext=(-6 if right else 6, -lift if up else lift), ha="right" if right else "left",
            va="top" if up else "bottom", fontsize=9, annotation_clip=True,
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"},
        )  # fmt: skip
    ax.set_xlabel("RAM (mean attention mass on the target, ranking data)")
    ax.set_ylabel(f"drop in answer log p ({summary.get('effect', 'exact')}, {summary.get('op', 'zero')})")
    rho = summary.get("spearman", float("nan"))
    ax.set_title(
        f"{title}: Spearman {rho:.2f} [{summary.get('low', float('nan')):.2f}, {summary.get('high', float('nan')):.2f}]",
        fontsize=10,
    )
    ax.margins(0.08)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
