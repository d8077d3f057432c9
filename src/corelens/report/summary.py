"""The findings that open a report, read from its run directories; each finding links to its run's section.

Rank runs give the top heads (mass, lift) and sparsity; a stability run the cross-task Spearman with its
interval; ablation runs top-k against random-k accuracy; hybrid runs the accuracy per kept fraction with its
ideal speed-up; flow runs their Table-1 analogue; SAP runs each condition's accuracy against vanilla.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from corelens.metrics.topology import sparsity

TOP = 3


def anchor(run: Path) -> str:
    """Return the HTML id of a run's section."""
    return "run-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in run.name)


def _link(run: Path) -> str:
    return f'<a href="#{anchor(run)}">{html.escape(run.name)}</a>'


def _ci(row: pd.Series, column: str = "accuracy") -> str:
    return f"{row[column]:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _rank(run: Path) -> str:
    heads = pd.read_csv(run / "heads.csv").sort_values("rank")
    best = "; ".join(
        f"L{int(r.layer)}H{int(r['head'])} (mass {r.mass:.3f}, lift {r.lift:.2f})"
        for _, r in heads.head(TOP).iterrows()
    )
    stats = sparsity(heads)
    return (
        f"{_link(run)}: top heads {best}. {stats['heads_for_50pct']:.1%} of {len(heads)} heads hold 50 % of "
        f"the mass, {stats['heads_for_80pct']:.1%} hold 80 %."
    )


def _stability(run: Path) -> str:
    rows = pd.read_csv(run / "spearman.csv")
    said = "; ".join(f"{r.a}–{r.b} {r.spearman:.2f} [{r.low:.2f}, {r.high:.2f}]" for _, r in rows.iterrows())
    return f"{_link(run)}: cross-task Spearman of head mass {said}."


def _ablate(run: Path) -> str:
    table = pd.read_csv(run / "ablation.csv")
    said = []
    for k, group in table[table["set"].isin(["top", "random"])].groupby("k", sort=True):
        top = group[group["set"] == "top"]
        rand = group[group["set"] == "random"]
        if top.empty or rand.empty:  # a sweep without a random control at this k
            continue
        said.append(
            f"k = {k}: top {_ci(top.iloc[0])} vs random {rand['accuracy'].mean():.3f} "
            f"[{rand['ci_low'].min():.3f}, {rand['ci_high'].max():.3f}] over {len(rand)} seed(s)"
        )
    none = table[table["set"] == "none"]
    base = f"unablated {_ci(none.iloc[0])}; " if len(none) else ""
    return f"{_link(run)}: accuracy {base}{'; '.join(said) or 'no top/random pair'}."


def _hybrid(run: Path) -> str:
    table = pd.read_csv(run / "hybrid.csv")
    top = table[table["set"].isin(["dense", "top"])].sort_values("fraction")
    said = "; ".join(
        f"{r.fraction:.0%} full heads: {_ci(r)} (ideal speed-up {r.ideal_speedup:.2f}×)"
        for _, r in top.iterrows()
    )
    return f"{_link(run)}: hybrid attention keeps {said}."


def _flow(run: Path) -> str:
    table = pd.read_csv(run / "table1.csv")
    said = "; ".join(f"{r.row}: RID {r.rid:.3f}, MixIG {r.mixig:.3f}" for _, r in table.iterrows())
    return f"{_link(run)}: Table-1 analogue {said}."


def _sap(run: Path) -> str:
    table = pd.read_csv(run / "accuracy.csv")
    said = "; ".join(f"{r.condition} {_ci(r)}" for _, r in table.iterrows())
    return f"{_link(run)}: accuracy {said}."


FINDINGS = {
    "rank": ("heads.csv", _rank),
    "stability": ("spearman.csv", _stability),
    "ablate": ("ablation.csv", _ablate),
    "hybrid": ("hybrid.csv", _hybrid),
    "flow": ("table1.csv", _flow),
    "sap": ("accuracy.csv", _sap),
}


def summary_section(runs: list[Path], manifests: list[dict]) -> str:
    """Return the opening "Findings" section: model, data and sample counts, then one item per run."""
    models = sorted(
        {str(m.get("settings", {}).get("model")) for m in manifests if m.get("settings", {}).get("model")}
    )
    counts = [
        f"{_link(r)} {m['samples']}" for r, m in zip(runs, manifests) if isinstance(m.get("samples"), int)
    ]
    items = []
    for run, manifest in zip(runs, manifests):
        table, finding = FINDINGS.get(manifest.get("command"), (None, None))
        if finding is not None and (run / table).is_file():  # an unfinished run has no table yet
            items.append(f"<li>{finding(run)}</li>")
    head = f"<p>Model: {html.escape(', '.join(models) or 'not recorded')}. Samples per run: {', '.join(counts) or 'not recorded'}.</p>"
    return f"<section id='findings'><h2>Findings</h2>{head}<ul>{''.join(items)}</ul></section>"


def shared_settings(manifests: list[dict]) -> dict:
    """Return the manifest entries (settings and versions) that every run shares, shown once."""
    flat = [_flat(m) for m in manifests]
    return {k: v for k, v in flat[0].items() if all(f.get(k) == v for f in flat[1:])} if flat else {}


def _flat(manifest: dict) -> dict:
    settings = {
        f"setting: {k}": json.dumps(v) if isinstance(v, (list, dict)) else v
        for k, v in manifest.get("settings", {}).items()
    }
    versions = {f"version: {k}": v for k, v in manifest.get("versions", {}).items()}
    return {**settings, **versions}
