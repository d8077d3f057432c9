"""The frontier's graded cells: a ranking's scores as per-KV-head key budgets (`graded`), at given KV budgets.

`corelens frontier --graded sink+window,top` answers the data, for each method and budget, under the
registered `graded` policy (`corelens.policies.graded_budget`, SparseMM's rule) built from the method's own
head scores (heads.csv's `mass`, the score every scorer writes; query-head scores summed per KV group by the
policy, KV rows as they are), its `budget` the share of the KV cache the method's binary cell keeps
(`cache_kept_fraction`) and its `sink` the frontier's S: the graded cell is at equal KV budget to the binary
one. The sweep is the one policy sweep (`corelens.experiments.policy_sweep`) with `graded_preset`: one
condition per (select, budget) plus the dense baseline, each answered through `corelens.policies.answer`,
each (condition, sample) answer logged before the next (resumable). Its table states each cell's kept share
as the policy reports it (`cache_kept_fraction`, the mean over the prompts: below the budget where a head's
budget is capped at the prompt); the frontier draws its curves (`corelens.report.frontier_curves`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd

from corelens.choices import STABLE_P
from corelens.errors import CorelensError
from corelens.experiment_registry import Outputs
from corelens.experiments.policy_sweep import RECORD, Plan, Preset, Tables, records_frame, sweep_policies
from corelens.experiments.sweep import condition_table
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared
from corelens.policies.graded_budget import SELECTS, GradedBudget
from corelens.runs.context import RunContext

DENSE = "dense"
SCORE = "mass"  # the heads.csv column every scorer writes its score into (higher: the head matters more)
# The graded sub-run's files (not a command of its own: the frontier runs it in methods/<label>/<gran>/graded).
OUTPUTS = Outputs("graded", {"records": "records.parquet", "table": "graded.csv", "summary": "graded_summary.csv",
                             "resampled": "resampled.csv"}, {}, {"sets": "policies.json"}, summary="table")  # fmt: skip
COLUMNS = ["set", "keep", "budget", "seed", "accuracy", "n", "correct", "ci_low", "ci_high",
           "cache_kept_fraction", "granularity", "short_by"]  # fmt: skip


def parse_selects(spec: str | Sequence[str] | None) -> list[str]:
    """Return the graded selects asked for: "sink+window", "top" or both ("sink+window,top"); none for None.

    Examples:
        >>> parse_selects("sink+window,top"), parse_selects(None)
        (['sink+window', 'top'], [])
    """
    if spec is None or spec == "":
        return []
    parts = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in str(s).split(",")]
    out = [p.strip() for p in parts if p.strip()]
    bad = [p for p in out if p not in SELECTS]
    if bad:
        raise CorelensError(f"--graded: unknown select {bad[0]!r}; expected {' or '.join(SELECTS)}, or both")
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Condition:
    """One graded cell (`policy`, at the binary cell `keep`'s KV budget) or the dense baseline (no policy)."""

    name: str
    kind: str  # the select, or "dense"
    keep: str
    policy: GradedBudget | None
    seed: None = None

    @property
    def k(self) -> str:
        """Return the binary cell's budget as given (the sweep's size)."""
        return self.keep

    @property
    def heads(self) -> tuple | None:
        """Return what tells the cells' generations apart (None: the dense baseline)."""
        return None if self.policy is None else (self.kind, self.policy.budget)


def scores_of(table: pd.DataFrame) -> tuple[tuple[int, int, float], ...]:
    """Return a head table's (layer, head, score) rows, the score its `mass` column."""
    if SCORE not in table:
        raise CorelensError(
            f"--graded: the head table has no {SCORE!r} column (the score of a rank run's heads.csv)"
        )
    return tuple((int(r.layer), int(r.head), float(getattr(r, SCORE))) for r in table.itertuples())


def graded_conditions(budgets: Mapping[str, float], sink: int, plan: Plan, ks, kinds, which, resampled=()):
    """Return the dense baseline, then per budget `ks` and select `kinds` the graded policy at `budgets[k]`."""
    scores = scores_of(plan.table)
    out = [Condition(DENSE, DENSE, "100%", None)]
    for keep in ks:
        for kind in kinds:
            policy = GradedBudget(scores, budget=budgets[keep], select=kind, sink=sink, granularity=plan.unit)
            out.append(Condition(f"{kind}/{keep}", kind, keep, policy))
    return out


def graded_tables(plan: Plan, ok: list[dict], conds) -> Tables:
    """Return the records (with each answer's kept share) and graded.csv: per cell its accuracy, Wilson
    interval and the mean kept share the policy reported."""
    records = records_frame(ok, [*RECORD, "cache_kept_fraction"])

    def row(c: Condition, got: pd.DataFrame, scores: dict) -> dict:
        kept = float(got["cache_kept_fraction"].mean()) if len(got) else float("nan")
        budget = 1.0 if c.policy is None else c.policy.budget
        return {"set": c.kind, "keep": c.keep, "budget": budget, "seed": None, **scores,
                "cache_kept_fraction": kept, "granularity": plan.unit, "short_by": 0}  # fmt: skip

    return Tables(records, condition_table(records, conds, row, COLUMNS), {})


def kept_share(prepared: Prepared, stats: dict) -> dict:
    """Return a record's kept share of the prompt's KV cache (`GradedBudget.report`; 1 for the baseline)."""
    return {"cache_kept_fraction": float(stats.get("cache_kept_fraction", 1.0))}


def graded_settings(budgets: Mapping[str, float], sink: int, plan: Plan) -> dict:
    """Return the graded sub-run's manifest settings: the budgets matched to the binary cells and S."""
    return {"heads": str(Path(plan.heads).resolve()), "budgets": dict(budgets), "sink": sink,
            "selects": list(plan.sets), "granularity": plan.unit}  # fmt: skip


def graded_preset(budgets: Mapping[str, float], sink: int) -> Preset:
    """Return the graded cells as a policy sweep: per select and binary budget k, `graded` at `budgets[k]`.

    Examples:
        >>> graded_preset({"2": 0.4}, 4).command
        'graded'
    """
    template = GradedBudget()
    return Preset(
        "graded", OUTPUTS, "keep", "n", template, ("scores", "budget", "select", "sink", "granularity"),
        conditions=partial(graded_conditions, budgets, sink),
        entry=lambda plan, c: {"name": c.name, **({"policy": c.policy.to_dict()} if c.policy else {})},
        tables=graded_tables,
        figure=lambda plan, tables, paths: None,  # its curves are drawn in the frontier's figure
        settings=partial(graded_settings, budgets, sink),
        record=kept_share,
    )  # fmt: skip


def graded_cells(
    m: Loaded,
    data: str | Path,
    heads: str | Path,
    budgets: Mapping[str, float],
    selects: Sequence[str],
    *,
    sink: int,
    granularity: str | None = None,
    seed: int = 0,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    ctx: RunContext | None = None,
    **context,
) -> pd.DataFrame:
    """Answer `data` under `graded` built from `heads`' scores at each KV budget of `budgets` (binary budget
    k -> share of the KV cache kept) for each select; return graded.csv (module docstring)."""
    swept = sweep_policies(
        graded_preset(budgets, sink), m, data, heads, ks=list(budgets), granularity=granularity,
        warn=lambda text: None, sets=list(selects), seeds=1, seed=seed, random_from="all", stable_p=STABLE_P,
        control_width=1.0, max_draws=1, rank_resamples=0, resample=True, scorer=scorer,
        max_new_tokens=max_new_tokens, ctx=RunContext.of(ctx, **context),
    )  # fmt: skip
    return swept.table
