"""The findings that open a report, read from its run directories; each finding links to its run's section.

Every finding is one sentence a reader can repeat. Accuracies and shares are written in percent (never a
fraction), each with its 95 % interval in brackets; a missing value is "—". Ablation and hybrid findings set
the top head set against its controls of the same size (bottom, random, layer-matched) and against the
unablated / dense model; a difference is claimed only where the 95 % interval of the difference excludes
zero, otherwise the sentence says "not decided at n = N" (N: samples per condition).

The interval of a difference of two accuracies is the MOVER interval (method of variance estimates recovery,
Newcombe's "hybrid score" interval when both are Wilson intervals): it combines the two accuracies' own
intervals, so a control drawn several times brings its two-level bootstrap interval from
`ablation_summary.csv`. It treats the two as independent; on the same samples (positively correlated answers)
it is conservative: a difference it decides is decided.

Task labels, run names, rows and conditions come from the runs' files: every finding is built with
`markupsafe.Markup`, which escapes them (see `corelens.report.html`). The tables are read by column name, so
columns added to them later are ignored.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from markupsafe import Markup

from corelens.data import jsonfile
from corelens.errors import CorelensError
from corelens.metrics.topology import sparsity
from corelens.runs.outputs import ABLATE, FLOW, FRONTIER, HYBRID, IMPORTANCE, OUTPUTS, RANK, SAP, STABILITY

TOP = 3
MISSING = "—"
CONTROLS = ("random", "bottom", "layer-matched")  # the top set's controls, in the order a finding names them
VERBS = {"zero": "Zeroing", "mean": "Mean-ablating", "uniform": "Flattening", "knockout": "Knocking out"}
MAX_NAMED = 4  # a top set of at most this many heads is named in its finding


def anchor(run: Path) -> str:
    """Return the HTML id of a run's section."""
    return "run-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in run.name)


def _link(run: Path) -> Markup:
    return Markup('<a href="#{}">{}</a>').format(anchor(run), run.name)


def missing(value) -> bool:
    """Return whether a table value is missing (None, NaN, pd.NA, or not a number at all)."""
    try:
        return value is None or bool(pd.isna(value)) or not math.isfinite(float(value))
    except (TypeError, ValueError):  # a string or a list: not a number
        return True


def pct(value) -> str:
    """Return a fraction as a whole percent, "25 %"; a missing one as "—"."""
    return MISSING if missing(value) else f"{100 * float(value):.0f} %"


def number(value, digits: int = 2) -> str:
    """Return a number with `digits` decimals; a missing one as "—"."""
    return MISSING if missing(value) else f"{float(value):.{digits}f}"


@dataclass(frozen=True)
class Estimate:
    """An accuracy (a fraction) with its 95 % interval, the samples per condition and the draws behind it."""

    value: float
    low: float
    high: float
    n: int | None = None
    draws: int = 1

    def text(self) -> str:
        """Return "25 % [7–59 %]"; "—" for a missing value, the value alone for a missing interval."""
        if missing(self.value):
            return MISSING
        if missing(self.low) or missing(self.high):
            return pct(self.value)
        return f"{100 * self.value:.0f} % [{100 * self.low:.0f}–{100 * self.high:.0f} %]"

    def known(self) -> bool:
        return not any(missing(v) for v in (self.value, self.low, self.high))


def difference(a: Estimate, b: Estimate) -> tuple[float, float, float]:
    """Return a - b and its 95 % MOVER interval from the two estimates' own intervals (see the module).

    Examples:
        >>> d, low, high = difference(Estimate(0.25, 0.07, 0.59), Estimate(0.97, 0.85, 1.0))
        >>> round(d, 2), bool(high < 0)
        (-0.72, True)
    """
    d = a.value - b.value
    low = d - math.hypot(a.value - a.low, b.high - b.value)
    high = d + math.hypot(a.high - a.value, b.value - b.low)
    return d, low, high


def _samples(*estimates: Estimate) -> str:
    ns = sorted({e.n for e in estimates if e.n is not None and not missing(e.n)})
    return " / ".join(str(int(n)) for n in ns) or MISSING


def versus(a: Estimate, b: Estimate, name: str = "top") -> str:
    """Return how `a` differs from `b`: "top lower by 72 points [40–95]", or "not decided at n = 8" where the
    interval of the difference includes zero (or a value is missing)."""
    if not (a.known() and b.known()):
        return f"not decided at n = {_samples(a, b)}"
    d, low, high = difference(a, b)
    if low <= 0 <= high:  # the interval of the difference holds zero: no difference is claimed
        return f"not decided at n = {_samples(a, b)}"
    near, far = sorted((abs(low), abs(high)))
    side = "lower" if d < 0 else "higher"
    return f"{name} {side}".strip() + f" by {100 * abs(d):.0f} points [{100 * near:.0f}–{100 * far:.0f}]"


def decided(a: Estimate, b: Estimate) -> int:
    """Return -1 / +1 where `a` is decidedly below / above `b`, 0 where the difference is not decided."""
    if not (a.known() and b.known()):
        return 0
    _, low, high = difference(a, b)
    return -1 if high < 0 else 1 if low > 0 else 0


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.is_file() else None


def _column(frame: pd.DataFrame, name: str, default=float("nan")) -> pd.Series:
    """Return a column, or `default` on every row where the table has no such column (an older run)."""
    return frame[name] if name in frame.columns else pd.Series(default, index=frame.index)


def _estimate(rows: pd.DataFrame) -> Estimate:
    """Return the estimate of one set at one size from its rows (one per draw).

    One row: its accuracy and Wilson interval. Several draws: their mean accuracy and the envelope of their
    intervals (wider than pooling their answers); `ablation_summary.csv`'s two-level bootstrap replaces it
    where the run wrote one (`_summarised`).
    """
    acc = pd.to_numeric(_column(rows, "accuracy"), errors="coerce")
    low = pd.to_numeric(_column(rows, "ci_low"), errors="coerce")
    high = pd.to_numeric(_column(rows, "ci_high"), errors="coerce")
    n = pd.to_numeric(_column(rows, "n"), errors="coerce").max()
    return Estimate(acc.mean(), low.min(), high.max(), None if missing(n) else int(n), len(rows))


def _summarised(estimate: Estimate, summary: pd.DataFrame | None, kind: str, level) -> Estimate:
    """Return `estimate` with the accuracy and interval of `summary`'s row for (`kind`, k = `level`), if any."""
    if summary is None or not {"set", "k", "accuracy", "ci_low", "ci_high"} <= set(summary.columns):
        return estimate
    row = summary[(summary["set"].astype(str) == kind) & (summary["k"].astype(str) == str(level))]
    if row.empty:
        return estimate
    r = row.iloc[0]
    return Estimate(r["accuracy"], r["ci_low"], r["ci_high"], estimate.n, estimate.draws)


def _data_name(manifest: dict) -> str:
    data = manifest.get("settings", {}).get("data")
    return Path(str(data)).name if data else "its data"


def _controls(sets: dict[str, Estimate], top: Estimate, size: str) -> list[str]:
    """Return one clause per control set of the top set's size: its accuracy and how the top set differs."""
    said = []
    for kind in CONTROLS:
        if kind not in sets:
            continue
        e = sets[kind]
        draws = f"{e.draws} draws; " if e.draws > 1 else ""
        count, unit = size.split(" ", 1)  # "3 heads" -> "3 random heads"
        said.append(f"{count} {kind} {unit}: {e.text()} ({draws}{versus(top, e)})")
    return said


def _unit(rows: pd.DataFrame, count: int) -> str:
    """Return "3 heads", "1 head", "2 KV heads": the size of a head set in the unit its table counts."""
    unit = "KV head" if (_column(rows, "granularity", "") == "kv").any() else "head"
    return f"{count} {unit}" + ("" if count == 1 else "s")


def _named(rows: pd.DataFrame, count: int) -> str:
    names = _column(rows, "heads", "").iloc[0]
    return f" ({names})" if isinstance(names, str) and names and count <= MAX_NAMED else ""


def read_heads(path: Path) -> pd.DataFrame:
    """Return a run's heads.csv as the report reads it: every layer and head an integer inside the grid the
    table lists, every head once (`corelens.heads.artifact.check_table`); else one line naming the file and
    line. A layer of 1e8 would otherwise make a heat map and an explorer grid of 1e8 rows.
    """
    from corelens.heads.artifact import check_table, csv_line, read_table

    table = read_table(path)
    try:
        layers = table["layer"].nunique() if "layer" in table.columns else 0
        heads = table["head"].nunique() if "head" in table.columns else 0
        return check_table(table, layers, heads, csv_line)
    except CorelensError as err:
        raise CorelensError(f"{path}: {err}") from None


def _rank(run: Path, manifest: dict) -> Markup:
    heads = read_heads(RANK.path(run, "heads")).sort_values("rank")
    score = manifest.get("settings", {}).get("score")
    name = score.get("name") if isinstance(score, dict) else None
    if name not in (None, "ram"):  # another scorer: its values, no RAM wording, lift or RAM sparsity
        kv = "granularity" in heads.columns and (heads["granularity"] == "kv").any()
        best = ", ".join(
            f"L{int(r.layer)}{'KV' if kv else 'H'}{int(r['head'])} {number(r.mass, 3)}"
            for _, r in heads.head(TOP).iterrows()
        )
        return Markup("{}: on {}, the {} ranked highest by the {} score are {}.").format(
            _link(run), _data_name(manifest), "KV heads" if kv else "heads", name, best
        )
    best = ", ".join(
        f"L{int(r.layer)}H{int(r['head'])} {pct(r.mass)} (lift {number(r.lift, 1)}×)"
        for _, r in heads.head(TOP).iterrows()
    )
    stats = sparsity(heads)
    return Markup(
        "{}: on {}, the heads with the most attention on the target region (RAM) are {}; "
        "{} of the {} heads hold half of all heads' RAM, {} hold 80 %."
    ).format(
        _link(run),
        _data_name(manifest),
        best,
        pct(stats["heads_for_50pct"]),
        len(heads),
        pct(stats["heads_for_80pct"]),
    )


def _stability(run: Path, manifest: dict) -> Markup:
    rows = pd.read_csv(STABILITY.path(run, "spearman"))
    said = []
    for _, r in rows.iterrows():
        text = Markup("{}–{} {} [{}, {}]").format(
            r.a, r.b, number(r.spearman), number(r.get("low")), number(r.get("high"))
        )
        if missing(r.get("low")) or missing(r.get("high")) or r["low"] <= 0 <= r["high"]:
            n = " / ".join(str(int(r[c])) for c in ("n_a", "n_b") if c in r and not missing(r[c]))
            text += Markup(" (not decided at n = {} samples)").format(n or MISSING)
        said.append(text)
    return Markup(
        "{}: head rankings across tasks, Spearman of per-head mean RAM [95 % interval]: {}."
    ).format(_link(run), Markup("; ").join(said))


def _sentence(parts: list[str]) -> str:
    return "; ".join(parts) + "."


def _ablate(run: Path, manifest: dict) -> Markup:
    return _items(run, ablation_sentences(run, manifest), "no top head set in ablation.csv")


def ablation_sentences(run: Path, manifest: dict) -> list[str]:
    """Return an ablation run's findings, one sentence per size of the top set (plain text, smallest first)."""
    table = pd.read_csv(ABLATE.path(run, "table"))
    summary = _read(ABLATE.path(run, "summary"))
    none = table[table["set"] == "none"]
    base = _estimate(none) if len(none) else None
    op = str(_column(table, "op", "zero").iloc[0]) if len(table) else "zero"
    verb = VERBS.get(op, f"Ablating ({op})")
    data = _data_name(manifest)
    said = []
    for k, rows in table[table["set"] != "none"].groupby("k", sort=False):
        top_rows = rows[rows["set"] == "top"]
        if top_rows.empty:  # a sweep without the top set at this k: nothing to set against the controls
            continue
        sets = {
            kind: _summarised(_estimate(part), summary, kind, k)
            for kind, part in rows.groupby("set", sort=False)
        }
        top = sets["top"]
        count = int(_column(top_rows, "k_heads", 0).iloc[0])
        head = f"{verb} the top {_unit(top_rows, count)}{_named(top_rows, count)}"
        if base is None:
            move = f"gives an accuracy on {data} of {top.text()}"
        else:
            way = decided(top, base)
            word = {-1: "drops", 1: "raises", 0: "moves"}[way]
            move = f"{word} accuracy on {data} from {base.text()} to {top.text()}"
            if not way:
                move += f" (not decided at n = {_samples(top, base)})"
        said.append((count, _sentence([f"{head} {move}", *_controls(sets, top, _unit(top_rows, count))])))
    said.sort(key=lambda pair: pair[0])
    return [text for _, text in said]


def _hybrid(run: Path, manifest: dict) -> Markup:
    return _items(run, hybrid_sentences(run, manifest), "no top head set in hybrid.csv")


def hybrid_sentences(run: Path, manifest: dict) -> list[str]:
    """Return a hybrid run's findings, one sentence per kept share of the top set (plain text, smallest first)."""
    table = pd.read_csv(HYBRID.path(run, "table"))
    dense_rows = table[table["set"] == "dense"]
    dense = _estimate(dense_rows) if len(dense_rows) else None
    data = _data_name(manifest)
    said = []
    for _, rows in table[table["set"] != "dense"].groupby("keep", sort=False):
        top_rows = rows[rows["set"] == "top"]
        if top_rows.empty:  # no top set at this share: nothing to set against the controls
            continue
        sets = {kind: _estimate(part) for kind, part in rows.groupby("set", sort=False)}
        top = sets["top"]
        count = int(_column(top_rows, "full_heads", 0).iloc[0])
        fraction = _column(top_rows, "fraction").iloc[0]
        head = f"Keeping the top {_unit(top_rows, count)} ({pct(fraction)} of all) full"
        speed = _column(top_rows, "ideal_speedup").iloc[0]
        speed = "" if missing(speed) else f", ideal speed-up {float(speed):.2f}×"
        if dense is None:
            move = f"gives an accuracy on {data} of {top.text()}{speed}"
        else:
            way = decided(top, dense)
            if way:
                move = f"{'lowers' if way < 0 else 'raises'} accuracy on {data} from {dense.text()} (dense) "
                move += f"to {top.text()}{speed}"
            else:
                move = f"keeps accuracy on {data} at {top.text()} against {dense.text()} dense"
                move += f" (not decided at n = {_samples(top, dense)}){speed}"
        said.append(
            (
                float(fraction) if not missing(fraction) else 0.0,
                _sentence([f"{head} {move}", *_controls(sets, top, _unit(top_rows, count))]),
            )
        )
    said.sort(key=lambda pair: pair[0])
    return [text for _, text in said]


def _frontier(run: Path, manifest: dict) -> Markup:
    return _items(run, frontier_sentences(run, manifest), "no method in frontier_budgets.csv")


def frontier_sentences(run: Path, manifest: dict) -> list[str]:
    """Return a frontier run's findings: per method and granularity, the smallest budget that keeps >= 95 % of
    dense accuracy (its KV cache kept, with the paired-bootstrap interval), or its best cell when none does."""
    budgets = pd.read_csv(FRONTIER.path(run, "budgets"))
    table = _read(FRONTIER.path(run, "table"))
    data = _data_name(manifest)
    said = []
    for _, b in budgets.iterrows():
        cells = table[(table["method"] == b["method"]) & (table["granularity"] == b["granularity"])]
        if cells.empty:
            continue
        dense = float(cells["dense_accuracy"].iloc[0])
        if bool(b["reached"]):
            row = cells[cells["full_heads"] == b["full_heads"]].sort_values("cache_kept_fraction").iloc[0]
            interval = ""
            if not missing(b.get("ci_low")):
                high = "beyond the budgets tried" if missing(b.get("ci_high")) else pct(b["ci_high"])
                interval = f" [{pct(b['ci_low'])}, {high}] of the cache"
            text = (f"{b['method']} keeps ≥ 95 % of dense accuracy on {data} ({pct(dense)}) from {_full(row, b['granularity'])}"
                    f", {pct(row['cache_kept_fraction'])} of the KV cache{interval}: "
                    f"{pct(row['hybrid_accuracy'])} [{pct(row['hybrid_ci_low'])}, {pct(row['hybrid_ci_high'])}]; "
                    f"zeroing that set leaves {pct(row['ablate_accuracy'])}")  # fmt: skip
        else:
            best = cells.sort_values("hybrid_accuracy").iloc[-1]
            text = (f"{b['method']} keeps < 95 % of dense accuracy on {data} ({pct(dense)}) at every budget tried; "
                    f"its best, {_full(best, b['granularity'])} ({pct(best['cache_kept_fraction'])} of the KV "
                    f"cache), keeps {pct(best['hybrid_accuracy'])} [{pct(best['hybrid_ci_low'])}, "
                    f"{pct(best['hybrid_ci_high'])}]")  # fmt: skip
        said.append(text)
    reached = budgets[budgets["reached"].astype(bool) & (budgets["method"] != "random")]
    if len(reached):
        best = reached.sort_values("cache_kept_fraction").iloc[0]
        said.append(f"Least KV cache kept at ≥ 95 % of dense accuracy: {best['method']} ({best['granularity']} "
                    f"heads), {pct(best['cache_kept_fraction'])} of the cache")  # fmt: skip
    return said + graded_sentences(table)


def graded_sentences(table: pd.DataFrame) -> list[str]:
    """Return per graded select (`frontier --graded`) where the graded cell beats its binary cell at the same
    KV share (its Wilson interval above the binary one's), or that it nowhere does.

    Examples:
        >>> t = pd.DataFrame({"method": ["ram", "ram"], "granularity": "query", "budget": ["2", "8"],
        ...     "cache_kept_fraction": [0.25, 0.6], "hybrid_accuracy": [0.2, 0.9], "hybrid_ci_low": [0.1, 0.8],
        ...     "hybrid_ci_high": [0.3, 1.0], "graded_top_accuracy": [0.9, 0.9], "graded_top_ci_low": [0.8, 0.8],
        ...     "graded_top_ci_high": [1.0, 1.0], "graded_top_kept": [0.25, 0.6]})
        >>> graded_sentences(t)
        ['Graded top beats binary hybrid at the same KV share in 1 of 2 cells: ram (query) at 2, 25 % of the cache: 90 % [80 %, 100 %] against 20 % [10 %, 30 %]']
    """
    said = []
    for how in ("sink+window", "top"):
        stem = "graded_" + how.replace("+", "_")
        if f"{stem}_accuracy" not in table:
            continue
        cells = table[table[f"{stem}_accuracy"].notna()]
        wins = cells[cells[f"{stem}_ci_low"] > cells["hybrid_ci_high"]]
        where = "; ".join(
            f"{r['method']} ({r['granularity']}) at {r['budget']}, {pct(r[f'{stem}_kept'])} of the cache: "
            f"{pct(r[f'{stem}_accuracy'])} [{pct(r[f'{stem}_ci_low'])}, {pct(r[f'{stem}_ci_high'])}] against "
            f"{pct(r['hybrid_accuracy'])} [{pct(r['hybrid_ci_low'])}, {pct(r['hybrid_ci_high'])}]"
            for _, r in wins.iterrows()
        )
        said.append(
            f"Graded {how} beats binary hybrid at the same KV share in {len(wins)} of {len(cells)} cells: {where}"
            if len(wins)
            else f"Graded {how} beats binary hybrid (intervals apart) in none of {len(cells)} cells"
        )
    return said


def _full(row: pd.Series, granularity: str) -> str:
    """Return a frontier cell's set size in words: "8 full heads", or "2 full KV heads (8 query heads)" at KV
    granularity (`full_heads` counts query heads; a table without `kv_full_heads` says only those)."""
    heads = int(row["full_heads"])
    if granularity != "kv":
        return f"{heads} full heads"
    kv = row.get("kv_full_heads")
    return (
        f"{heads} full query heads"
        if missing(kv)
        else f"{round(float(kv))} full KV heads ({heads} query heads)"
    )


def _items(run: Path, sentences: list[str], empty: str) -> Markup:
    """Return a run's finding: its link, then one sentence per size of the head sets."""
    if len(sentences) == 1:
        return Markup("{}: {}").format(_link(run), sentences[0])
    body = Markup("").join(Markup("<li>{}</li>").format(s) for s in sentences)
    return (
        Markup("{}:<ul>{}</ul>").format(_link(run), body)
        if sentences
        else Markup("{}: {}.").format(_link(run), empty)
    )


def _flow(run: Path, manifest: dict) -> Markup:
    table = pd.read_csv(FLOW.path(run, "table"))
    said = Markup("; ").join(
        Markup("{}: RID {}, MixIG {}").format(r.row, number(r.rid, 3), number(r.mixig, 3))
        for _, r in table.iterrows()
    )
    return Markup("{}: Table-1 analogue {}.").format(_link(run), said)


def _sap(run: Path, manifest: dict) -> Markup:
    table = pd.read_csv(SAP.path(run, "accuracy"))
    conditions = {str(r.condition): _estimate(table.loc[[i]]) for i, r in table.iterrows()}
    vanilla = conditions.get("vanilla")
    said = []
    for name, e in conditions.items():
        against = "" if vanilla is None or name == "vanilla" else f" ({versus(e, vanilla, name='')})"
        said.append(f"{name} {e.text()}{against}")
    return Markup("{}: accuracy under SAP on {}: {}.").format(
        _link(run), _data_name(manifest), "; ".join(said)
    )


def _importance(run: Path, manifest: dict) -> Markup:
    """RAM against causal importance (`corelens importance`): their Spearman, its interval, who disagrees."""
    path = IMPORTANCE.path(run, "summary")
    info = jsonfile.load(path) if path.is_file() else {}
    rho, low, high = info.get("spearman"), info.get("low"), info.get("high")
    text = Markup("{}: on {}, RAM and causal importance ({} of one head, {} drop of the answer's log p) agree with "
                  "Spearman {} [{}, {}]").format(
        _link(run), _data_name(manifest), info.get("op", MISSING), info.get("effect", MISSING), number(rho),
        number(low), number(high),
    )  # fmt: skip
    if missing(low) or missing(high) or float(low) <= 0 <= float(high):
        text += Markup(" (not decided at n = {} samples)").format(info.get("samples", MISSING))
    said = Markup(", ").join(
        Markup("{} (RAM rank {}, causal rank {})").format(
            d.get("head"), d.get("ram_rank"), d.get("causal_rank")
        )
        for d in info.get("disagree", [])[:3]
    )
    text += Markup("; most disagreeing heads: {}").format(said or MISSING)
    versus_exact = info.get("attribution_vs_exact")
    if versus_exact:
        text += Markup("; attribution patching against the exact effects: Spearman {} over heads").format(
            number(versus_exact.get("spearman_heads"))
        )
    return text + Markup(".")


FINDINGS = {
    "rank": _rank,
    "stability": _stability,
    "ablate": _ablate,
    "hybrid": _hybrid,
    "frontier": _frontier,
    "flow": _flow,
    "sap": _sap,
    "importance": _importance,
}
"""The sentence of each command's finding; which table it needs is the command's declared summary table
(`corelens.runs.outputs.OUTPUTS`)."""

LEGEND = (
    "Accuracies and shares in percent, 95 % intervals in brackets, — where a value is missing. A difference "
    "is claimed only where the 95 % interval of the difference excludes zero; otherwise the finding says "
    "“not decided at n = N” (N samples per condition)."
)


def summary_section(runs: list[Path], manifests: list[dict]) -> Markup:
    """Return the opening "Findings" section: model, data and sample counts, then one item per run."""
    models = sorted(
        {
            shown_path(str(m["settings"]["model"]), run.parent)
            for run, m in zip(runs, manifests)
            if m.get("settings", {}).get("model")
        }
    )
    counts = [
        Markup("{} {}").format(_link(r), m["samples"])
        for r, m in zip(runs, manifests)
        if isinstance(m.get("samples"), int)
    ]
    items = []
    for run, manifest in zip(runs, manifests):
        command = manifest.get("command")
        finding, outputs = FINDINGS.get(command), OUTPUTS.get(command)
        if (
            finding is not None and (run / outputs.summary_file).is_file()
        ):  # an unfinished run has no table yet
            items.append(Markup("<li>{}</li>").format(finding(run, manifest)))
    head = Markup("<p>Model: {}. Samples per run: {}.</p><p class='legend'>{}</p>").format(
        ", ".join(models) or "not recorded", Markup(", ").join(counts) or "not recorded", LEGEND
    )
    return Markup("<section id='findings'><h2>Findings</h2>{}<ul>{}</ul></section>").format(
        head, Markup("").join(items)
    )


def shared_settings(manifests: list[dict]) -> dict:
    """Return the manifest entries (settings and versions) that every run shares, shown once."""
    flat = [_flat(m) for m in manifests]
    return {k: v for k, v in flat[0].items() if all(f.get(k) == v for f in flat[1:])} if flat else {}


_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]{7,})")


def shown_path(path: str, base: Path | None = None) -> str:
    """Return how the page names an absolute path of this machine: relative to `base` (the folder the runs sit
    in) or to the working folder when inside them, a hub checkpoint as ORG/NAME@COMMIT, a file of corelens
    (the bundled model) inside its package, else its last two parts; a relative path as it is.

    Examples:
        >>> shown_path("/home/me/.cache/huggingface/hub/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/0123456789abcdef")
        'Qwen/Qwen2.5-VL-7B-Instruct@0123456789ab'
        >>> shown_path("/srv/study/data/eval.jsonl", Path("/srv/study")), shown_path("/a/b/c/d.jsonl")
        ('data/eval.jsonl', '…/c/d.jsonl')
        >>> shown_path("runs/rank")
        'runs/rank'
    """
    if not os.path.isabs(path):
        return path
    found = _SNAPSHOT.search(path)
    if found:
        return f"{found.group(1)}/{found.group(2)}@{found.group(3)[:12]}"
    package = Path(__file__).resolve().parents[2]  # the folder holding the corelens package (src/)
    for root in (base, Path.cwd(), package):
        if root is not None and Path(path).is_relative_to(root):
            return str(Path(path).relative_to(root)) or "."
    return "…/" + "/".join(Path(path).parts[-2:])


def shown_paths(text: str, base: Path | None = None) -> str:
    """Return `text` (a command line, a setting) with each absolute path in it as `shown_path` names it."""
    return " ".join(shown_path(word, base) for word in text.split(" "))


def shown_setting(key: str, value: object, base: Path | None = None) -> object:
    """Return a manifest setting as the report shows it: the model's identity (config fields and tensors,
    corelens.runs.identity) as its one-line description, a path of this machine as `shown_path` names it
    (no absolute path in a page that is passed around), everything else as it is."""
    if key == "model_identity" and isinstance(value, dict):
        from corelens.runs.identity import describe

        return describe(value)
    if isinstance(value, str):
        return shown_paths(value, base)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # stability's runs
        return [shown_paths(v, base) for v in value]
    return value


def _flat(manifest: dict) -> dict:
    settings = {
        f"setting: {k}": json.dumps(v) if isinstance(v, (list, dict)) else v
        for k, v in ((k, shown_setting(k, v)) for k, v in manifest.get("settings", {}).items())
    }
    versions = {f"version: {k}": v for k, v in manifest.get("versions", {}).items()}
    return {**settings, **versions}
