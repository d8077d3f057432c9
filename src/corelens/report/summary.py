"""The findings that open a report, read from its run directories; each finding links to its run's section.

Rank runs give the top heads (mass, lift) and sparsity; a stability run the cross-task Spearman with its
interval; ablation runs top-k against random-k accuracy; hybrid runs the accuracy per kept fraction with its
ideal speed-up; flow runs their Table-1 analogue; SAP runs each condition's accuracy against vanilla.

Task labels, run names, rows and conditions come from the runs' files: every finding is built with
`markupsafe.Markup`, which escapes them (see `corelens.report.html`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from markupsafe import Markup

from corelens.metrics.topology import sparsity

TOP = 3


def anchor(run: Path) -> str:
    """Return the HTML id of a run's section."""
    return "run-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in run.name)


def _link(run: Path) -> Markup:
    return Markup('<a href="#{}">{}</a>').format(anchor(run), run.name)


def _ci(row: pd.Series, column: str = "accuracy") -> Markup:
    return Markup("{:.3f} [{:.3f}, {:.3f}]").format(row[column], row["ci_low"], row["ci_high"])


def _rank(run: Path) -> Markup:
    heads = pd.read_csv(run / "heads.csv").sort_values("rank")
    best = Markup("; ").join(
        Markup("L{}H{} (mass {:.3f}, lift {:.2f})").format(int(r.layer), int(r["head"]), r.mass, r.lift)
        for _, r in heads.head(TOP).iterrows()
    )
    stats = sparsity(heads)
    return Markup("{}: top heads {}. {:.1%} of {} heads hold 50 % of the mass, {:.1%} hold 80 %.").format(
        _link(run), best, stats["heads_for_50pct"], len(heads), stats["heads_for_80pct"]
    )


def _stability(run: Path) -> Markup:
    rows = pd.read_csv(run / "spearman.csv")
    said = Markup("; ").join(
        Markup("{}–{} {:.2f} [{:.2f}, {:.2f}]").format(r.a, r.b, r.spearman, r.low, r.high)
        for _, r in rows.iterrows()
    )
    return Markup("{}: cross-task Spearman of head mass {}.").format(_link(run), said)


def _ablate(run: Path) -> Markup:
    table = pd.read_csv(run / "ablation.csv")
    said = []
    for k, group in table[table["set"].isin(["top", "random"])].groupby("k", sort=True):
        top = group[group["set"] == "top"]
        rand = group[group["set"] == "random"]
        if top.empty or rand.empty:  # a sweep without a random control at this k
            continue
        said.append(
            Markup("k = {}: top {} vs random {:.3f} [{:.3f}, {:.3f}] over {} seed(s)").format(
                k,
                _ci(top.iloc[0]),
                rand["accuracy"].mean(),
                rand["ci_low"].min(),
                rand["ci_high"].max(),
                len(rand),
            )
        )
    none = table[table["set"] == "none"]
    base = Markup("unablated {}; ").format(_ci(none.iloc[0])) if len(none) else ""
    return Markup("{}: accuracy {}{}.").format(
        _link(run), base, Markup("; ").join(said) or "no top/random pair"
    )


def _hybrid(run: Path) -> Markup:
    table = pd.read_csv(run / "hybrid.csv")
    top = table[table["set"].isin(["dense", "top"])].sort_values("fraction")
    said = Markup("; ").join(
        Markup("{:.0%} full heads: {} (ideal speed-up {:.2f}×)").format(r.fraction, _ci(r), r.ideal_speedup)
        for _, r in top.iterrows()
    )
    return Markup("{}: hybrid attention keeps {}.").format(_link(run), said)


def _flow(run: Path) -> Markup:
    table = pd.read_csv(run / "table1.csv")
    said = Markup("; ").join(
        Markup("{}: RID {:.3f}, MixIG {:.3f}").format(r.row, r.rid, r.mixig) for _, r in table.iterrows()
    )
    return Markup("{}: Table-1 analogue {}.").format(_link(run), said)


def _sap(run: Path) -> Markup:
    table = pd.read_csv(run / "accuracy.csv")
    said = Markup("; ").join(Markup("{} {}").format(r.condition, _ci(r)) for _, r in table.iterrows())
    return Markup("{}: accuracy {}.").format(_link(run), said)


FINDINGS = {
    "rank": ("heads.csv", _rank),
    "stability": ("spearman.csv", _stability),
    "ablate": ("ablation.csv", _ablate),
    "hybrid": ("hybrid.csv", _hybrid),
    "flow": ("table1.csv", _flow),
    "sap": ("accuracy.csv", _sap),
}


def summary_section(runs: list[Path], manifests: list[dict]) -> Markup:
    """Return the opening "Findings" section: model, data and sample counts, then one item per run."""
    models = sorted(
        {str(m.get("settings", {}).get("model")) for m in manifests if m.get("settings", {}).get("model")}
    )
    counts = [
        Markup("{} {}").format(_link(r), m["samples"])
        for r, m in zip(runs, manifests)
        if isinstance(m.get("samples"), int)
    ]
    items = []
    for run, manifest in zip(runs, manifests):
        table, finding = FINDINGS.get(manifest.get("command"), (None, None))
        if finding is not None and (run / table).is_file():  # an unfinished run has no table yet
            items.append(Markup("<li>{}</li>").format(finding(run)))
    head = Markup("<p>Model: {}. Samples per run: {}.</p>").format(
        ", ".join(models) or "not recorded", Markup(", ").join(counts) or "not recorded"
    )
    return Markup("<section id='findings'><h2>Findings</h2>{}<ul>{}</ul></section>").format(
        head, Markup("").join(items)
    )


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
