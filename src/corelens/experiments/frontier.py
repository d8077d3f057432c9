"""The frontier: several head rankings compared on one accuracy-budget curve (`corelens frontier`).

For each method (a heads.csv of `corelens rank`, or an exported head set), each granularity and each budget
(a count or share of heads kept full, as `hybrid --keep`), the cell is the method's top set under hybrid
attention (`corelens.experiments.hybrid.curve`) and the same set zeroed (`corelens.experiments.ablate.sweep`),
each run as its own resumable run folder under `methods/<label>/<granularity>/` (hybrid, ablate): a frontier
cell is exactly what `hybrid` / `ablate` give on the same set and data. The random control is drawn once (on
the first method's table, as those commands draw it). The tail writes `frontier.csv`, `frontier_budgets.csv`
(per method the smallest budget keeping >= 95 % of dense accuracy, with a paired bootstrap interval over the
samples), `rankings.csv` (pairwise top-k overlap and Spearman, at each granularity) and `figures/frontier.png`.
With `graded` ("sink+window", "top" or both), each method's cells are also answered under the `graded` policy
built from its own scores at the binary cell's share of the KV cache (`corelens.experiments.graded_cells`, run
folder `methods/<label>/<granularity>/graded`): per select, columns `graded_<select>_accuracy`, `_ci_low`,
`_ci_high` (Wilson), `_kept` (the share the policy reports) and `_relative` (`graded_columns`), a dashed curve.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from corelens.errors import CorelensError
from corelens.experiments import ablate, hybrid
from corelens.experiments.graded_cells import graded_cells, parse_selects
from corelens.experiments.policy_sweep import read_heads
from corelens.metrics import draws as draw_rules
from corelens.metrics.headsets import k_count, parse_k, select
from corelens.metrics.kvheads import granularity_of
from corelens.models.loaded import Loaded
from corelens.runs import model_data_settings
from corelens.runs.context import RunContext
from corelens.runs.outputs import FRONTIER, conclude

LEVEL = 0.95  # the share of dense accuracy a budget must keep
BOOTSTRAP = 1000  # paired resamples of the evaluation samples behind the smallest budget's interval
RANDOM = "random"
COLUMNS = [
    "method", "scorer", "granularity", "budget", "full_heads", "fraction", "kv_fraction", "cache_kept_fraction",
    "dense_accuracy", "hybrid_accuracy", "hybrid_ci_low", "hybrid_ci_high", "hybrid_interval", "relative",
    "ablate_accuracy", "ablate_ci_low", "ablate_ci_high", "drop", "draws", "n", "kv_full_heads",
]  # fmt: skip


def graded_columns(select: str) -> list[str]:
    """Return frontier.csv's columns of one graded select (added only with `--graded`).

    Examples:
        >>> graded_columns("sink+window")[:2]
        ['graded_sink_window_accuracy', 'graded_sink_window_ci_low']
    """
    stem = "graded_" + select.replace("+", "_")
    return [f"{stem}_{x}" for x in ("accuracy", "ci_low", "ci_high", "kept", "relative")]


def add_graded(rows: list[dict], graded: pd.DataFrame, selects: Sequence[str]) -> None:
    """Fill the graded columns of one method's rows (its top set's, by budget) from its graded.csv."""
    for r in rows:
        for how in selects:
            got = graded[(graded["set"] == how) & (graded["keep"].astype(str) == r["budget"])]
            names = graded_columns(how)
            values = [float("nan")] * 5
            if len(got):
                g = got.iloc[0]
                acc = float(g["accuracy"])
                dense = r["dense_accuracy"]
                rel = acc / dense if dense else float("nan")
                values = [acc, float(g["ci_low"]), float(g["ci_high"]), float(g["cache_kept_fraction"]), rel]
            r.update(zip(names, values))


@dataclass(frozen=True)
class Method:
    """One compared ranking: its label, the scorer it records (or "") and its heads.csv."""

    label: str
    scorer: str
    heads: Path


def recorded_scorer(heads: Path) -> str:
    """Return the scorer a ranking records: `scorer` or `score` (a name, or a scorer's `{"name": ...}`) at the
    top of its headset.json or rank manifest, or in their settings / source / ranking / provenance; "ram" for
    a rank run that records none (RAM's runs record no score); "" if nothing says.

    Examples:
        >>> import json, tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "manifest.json").write_text(json.dumps({"command": "rank", "settings": {}}))
        >>> recorded_scorer(folder / "heads.csv")
        'ram'
        >>> _ = (folder / "headset.json").write_text(json.dumps({"provenance": {"score": {"name": "gates"}}}))
        >>> recorded_scorer(folder / "heads.csv")
        'gates'
    """
    rank_run = False
    for name in ("headset.json", "manifest.json"):
        path = heads.parent / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        rank_run = rank_run or (name == "manifest.json" and data.get("command") == "rank")
        nested = [data.get(k, {}) for k in ("settings", "source", "ranking", "provenance")]
        for where in (data, *nested):
            if isinstance(where, dict):
                for key in ("scorer", "score"):
                    value = where.get(key)
                    if isinstance(value, dict):
                        value = value.get("name")
                    if isinstance(value, str):
                        return value
    return "ram" if rank_run else ""


def methods_of(specs: Sequence[str]) -> list[Method]:
    """Return the methods of `--heads` entries: PATH or LABEL=PATH (heads.csv, headset.json or their folder).

    The label is the one given, else the scorer the file records, else its folder's name; repeated labels get
    a suffix.

    Examples:
        >>> [m.label for m in methods_of(["ram=runs/a/heads.csv", "runs/b/heads.csv", "runs/b/heads.csv"])]
        ['ram', 'b', 'b-2']
    """
    from corelens.heads import resolve_heads

    out: list[Method] = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or "/" in label or not re.fullmatch(r"[\w.+-]+", label):
            label, path = "", spec
        heads = resolve_heads(path) if Path(path).exists() else Path(path)
        scorer = recorded_scorer(heads)
        name = label or scorer or heads.parent.name or heads.stem
        taken = {m.label for m in out}
        unique, i = name, 2
        while unique in taken:
            unique, i = f"{name}-{i}", i + 1
        out.append(Method(unique, scorer, heads))
    return out


def cells(
    hyb: pd.DataFrame, abl: pd.DataFrame, hyb_table: pd.DataFrame, method: Method, gran: str, sets
) -> list:
    """Return the frontier rows of one method at one granularity: its top set (and `sets`' controls)."""
    dense = hyb_table[hyb_table["set"] == hybrid.DENSE]
    dense_acc = float(dense["accuracy"].iloc[0]) if len(dense) else float("nan")
    rows = []
    for kind in sets:
        for _, h in hyb[hyb["set"] == kind].iterrows():
            keep = str(h["keep"])
            per = hyb_table[(hyb_table["set"] == kind) & (hyb_table["keep"].astype(str) == keep)]
            a = abl[(abl["set"] == kind) & (abl["k"].astype(str) == keep)]
            abl_acc = float(a["accuracy"].iloc[0]) if len(a) else float("nan")
            rows.append(
                {
                    "method": method.label if kind == "top" else RANDOM,
                    "scorer": method.scorer if kind == "top" else "",
                    "granularity": gran,
                    "budget": keep,
                    "full_heads": int(h["full_heads"]),
                    "fraction": float(per["fraction"].mean()),
                    "kv_fraction": float(per["kv_fraction"].mean()),
                    "cache_kept_fraction": float(per["cache_kept_fraction"].mean()),
                    "dense_accuracy": dense_acc,
                    "hybrid_accuracy": float(h["accuracy"]),
                    "hybrid_ci_low": float(h["ci_low"]),
                    "hybrid_ci_high": float(h["ci_high"]),
                    "hybrid_interval": h["interval"],
                    "relative": float(h["accuracy"]) / dense_acc if dense_acc else float("nan"),
                    "ablate_accuracy": abl_acc,
                    "ablate_ci_low": float(a["ci_low"].iloc[0]) if len(a) else float("nan"),
                    "ablate_ci_high": float(a["ci_high"].iloc[0]) if len(a) else float("nan"),
                    "drop": dense_acc - abl_acc,
                    "draws": int(h["seeds"]),
                    "n": int(per["n"].iloc[0]),
                    "kv_full_heads": float(per["kv_full_heads"].mean()),
                }
            )
    return rows


def smallest_budget(table: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Return per (method, granularity) the smallest budget (by KV cache kept) whose hybrid accuracy is at
    least `level` x dense accuracy; `reached` False (and NaN sizes) when no budget does.

    Examples:
        >>> t = pd.DataFrame({"method": ["a", "a", "a"], "granularity": "query", "budget": ["2", "4", "8"],
        ...     "full_heads": [2, 4, 8], "cache_kept_fraction": [0.3, 0.5, 0.7], "dense_accuracy": 1.0,
        ...     "hybrid_accuracy": [0.5, 0.95, 1.0]})
        >>> smallest_budget(t)[["method", "budget", "full_heads", "cache_kept_fraction", "reached"]].to_dict("records")
        [{'method': 'a', 'budget': '4', 'full_heads': 4.0, 'cache_kept_fraction': 0.5, 'reached': True}]
    """
    rows = []
    for (method, gran), group in table.groupby(["method", "granularity"], sort=False):
        group = group.sort_values("cache_kept_fraction")
        ok = group[group["hybrid_accuracy"] >= level * group["dense_accuracy"] - 1e-12]
        first = ok.iloc[0] if len(ok) else None
        rows.append(
            {
                "method": method,
                "granularity": gran,
                "level": level,
                "budget": None if first is None else str(first["budget"]),
                "full_heads": float("nan") if first is None else float(first["full_heads"]),
                "cache_kept_fraction": float("nan") if first is None else float(first["cache_kept_fraction"]),
                "reached": first is not None,
            }
        )
    return pd.DataFrame(rows)


def budget_interval(
    answers: pd.DataFrame, order: Sequence[str], kept: Sequence[float], level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Return the 95 % paired-bootstrap interval of the smallest budget's KV cache kept.

    `answers`: one row per sample, a `dense` column and one column per budget's condition in `order` (their
    KV cache kept `kept`, increasing); each resample of the samples finds its smallest budget; a resample
    where none reaches counts as beyond the last (an upper bound of NaN: not reached within the budgets).
    """
    values = answers[["dense", *order]].to_numpy(dtype=float)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP, len(values)))
    means = values[picks].mean(axis=1)  # (resamples, 1 + budgets)
    ok = means[:, 1:] >= level * means[:, :1] - 1e-12
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), len(order))
    low, high = (int(np.percentile(first, q, method=m)) for q, m in ((2.5, "lower"), (97.5, "higher")))
    at = list(kept) + [float("nan")]
    return at[low], at[high]


def rankings(tables: dict[str, pd.DataFrame], counts: Sequence[int]) -> pd.DataFrame:
    """Return each pair of methods' top-k overlap (shared heads / k) at each count and their Spearman over heads."""
    rows = []
    labels = list(tables)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            ta, tb = tables[a], tables[b]
            merged = ta[["layer", "head", "rank"]].merge(tb[["layer", "head", "rank"]], on=["layer", "head"])
            rho = (
                float(spearmanr(merged["rank_x"], merged["rank_y"]).statistic) if len(merged) > 2 else np.nan
            )
            for k in counts:
                shared = set(select(ta, "top", k)) & set(select(tb, "top", k))
                rows.append(
                    {"method_a": a, "method_b": b, "k": k, "overlap": len(shared) / k, "spearman": rho}
                )
    return pd.DataFrame(rows, columns=["method_a", "method_b", "k", "overlap", "spearman"])


def agreement(tables: dict, grans: Sequence[str | None], ks: Sequence[str]) -> pd.DataFrame:
    """Return `rankings` at each granularity (`tables`: (label, granularity) -> head table in that unit), the
    budgets `ks` counted in that unit, with a `granularity` column."""
    parts = []
    for gran in grans:
        mine = {label: t for (label, g), t in tables.items() if g == gran}
        counts = sorted({k_count(k, len(t)) for t in mine.values() for k in ks})
        unit = gran or granularity_of(next(iter(mine.values())))
        parts.append(rankings(mine, counts).assign(granularity=unit))
    return pd.concat(parts, ignore_index=True)


@dataclass
class Frontier:
    """The result: the cells (`table`), the smallest budgets (`budgets`) and the rankings' agreement."""

    table: pd.DataFrame
    budgets: pd.DataFrame
    rankings: pd.DataFrame


def frontier(
    m: Loaded,
    data: str | Path,
    heads: Sequence[str],
    *,
    budgets: str | Sequence[str] = ("2", "4", "8", "16"),
    granularity: Sequence[str] | str | None = None,
    sink: str | int = 128,
    window: str | int = 1024,
    draws: int | str = draw_rules.AUTO,
    seed: int = 0,
    op: str = "zero",
    control_width: float = draw_rules.WIDTH,
    max_draws: int = draw_rules.MAX_DRAWS,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    graded: str | Sequence[str] | None = None,
    ctx: RunContext | None = None,
    **context,
) -> Frontier:
    """Compare the rankings `heads` (PATH or LABEL=PATH) on `data`: hybrid accuracy and ablation drop of each
    one's top set at each budget (module docstring). `granularity`: "query", "kv", a list of both, or None
    (each table's own). The random control (`draws` draws) is drawn on the first method's table. `graded`:
    the selects of the graded cells ("sink+window,top"; None: none), at each binary cell's KV budget."""
    ctx = RunContext.of(ctx, **context)
    selects = parse_selects(graded)
    methods = methods_of(list(heads))
    if len(methods) < 1:
        raise CorelensError("frontier: give at least one --heads file")
    grans = [granularity] if isinstance(granularity, str) or granularity is None else list(granularity)
    grans = [g for part in grans for g in ([None] if part is None else str(part).split(","))]
    ks = parse_k(budgets)
    tables = {}
    for method in methods:  # every file checked before the first answer: a bad one is one line, now
        for gran in grans:
            tables[(method.label, gran)] = read_heads(method.heads, m, gran)
    run = ctx.open(
        "frontier",
        {
            **model_data_settings(m, data),
            "heads": {x.label: str(x.heads.resolve()) for x in methods},
            "budgets": list(ks),
            "granularity": [g or "own" for g in grans],
            "sink": str(sink),
            "window": str(window),
            "draws": str(draws),
            "seed": seed,
            "op": op,
        },
    )
    rows, budget_rows = [], []
    for gran in grans:
        for i, method in enumerate(methods):
            sets = ["top", "random"] if i == 0 else ["top"]
            where = None if ctx.out is None else Path(ctx.out) / "methods" / method.label / (gran or "own")
            common = {"seeds": draws, "seed": seed, "control_width": control_width, "max_draws": max_draws,
                      "scorer": scorer, "max_new_tokens": max_new_tokens, "granularity": gran}  # fmt: skip
            sub = {f: getattr(ctx, f) for f in ("skip_bad", "limit", "limits", "progress", "argv")}
            h = hybrid.curve(m, data, method.heads, keeps=ks, sets=sets, sink=sink, window=window,
                             ctx=RunContext(out=None if where is None else where / "hybrid", **sub), **common)  # fmt: skip
            a = ablate.sweep(m, data, method.heads, ks=ks, sets=sets, op=op,
                             ctx=RunContext(out=None if where is None else where / "ablate", **sub), **common)  # fmt: skip
            unit = gran or granularity_of(tables[(method.label, gran)])
            got = cells(h.summary, a.summary, h.table, method, unit, sets)
            if selects:
                mine = [r for r in got if r["method"] == method.label]
                budgets = {r["budget"]: r["cache_kept_fraction"] for r in mine}
                g = graded_cells(m, data, method.heads, budgets, selects, sink=h.sink, granularity=gran,
                                 seed=seed, scorer=scorer, max_new_tokens=max_new_tokens,
                                 ctx=RunContext(out=None if where is None else where / "graded", **sub))  # fmt: skip
                add_graded(mine, g, selects)
            rows += got
            budget_rows.append(
                _budget(h, method.label, unit, [r for r in got if r["method"] == method.label], seed)
            )
    table = pd.DataFrame(rows, columns=COLUMNS + [c for x in selects for c in graded_columns(x)])
    found = smallest_budget(table)
    intervals = pd.DataFrame(budget_rows, columns=["method", "granularity", "ci_low", "ci_high"])
    found = found.merge(intervals, on=["method", "granularity"], how="left")
    found["interval"] = np.where(found["method"] == RANDOM, "", "paired bootstrap over samples")
    agree = agreement(tables, grans, ks)
    result = Frontier(table, found, agree)
    if run is not None:
        from corelens.report.frontier_curves import frontier_figure

        samples = int(table["n"].max()) if len(table) else 0
        draw = lambda paths: frontier_figure(table, paths["frontier"], title=f"frontier on {Path(data).name}")  # noqa: E731
        tables_out = {"table": table, "budgets": found, "rankings": agree}
        said = {"methods": [x.__dict__ for x in methods], **({"graded": selects} if selects else {})}
        conclude(run, FRONTIER, tables_out, draw=draw, manifest=said, samples=samples)
    return result


def _budget(h, label: str, gran: str, rows: list[dict], seed: int) -> dict:
    """Return the paired-bootstrap interval (KV cache kept) of one method's smallest budget."""
    rows = sorted(rows, key=lambda r: r["cache_kept_fraction"])
    names = {r["budget"]: f"top/{r['budget']}" for r in rows}
    answers = h.records.pivot_table(index="sample", columns="condition", values="correct", aggfunc="first")
    order = [names[r["budget"]] for r in rows]
    if not order or any(c not in answers for c in ["dense", *order]):
        return {"method": label, "granularity": gran, "ci_low": np.nan, "ci_high": np.nan}
    low, high = budget_interval(answers.dropna(), order, [r["cache_kept_fraction"] for r in rows], seed=seed)
    return {"method": label, "granularity": gran, "ci_low": low, "ci_high": high}


def run_command(config, ctx, load_options: dict) -> Frontier:
    """`corelens frontier`: load the model and run the frontier of `config` under `ctx`."""
    from corelens.models.loaded import load

    for method in methods_of(config.heads):  # a missing heads file is one line before the model loads
        if not method.heads.exists():
            raise CorelensError(f"{method.heads}: no such head table (expected a rank run's heads.csv)")
    m = load(config.model, **load_options)
    return frontier(m, config.data, config.heads, ctx=ctx, **config.kwargs())
