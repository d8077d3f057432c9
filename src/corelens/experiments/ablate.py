"""Ablation sweep: head sets from a rank run x k -> greedy accuracy per set -> ablation.csv + dose-response figure.

Heads are identified on one file (the rank run) and evaluated on another; the sweep warns when both are the
same file (by sha256). `mean` statistics come from a reference file only — by default the rank run's own data
(the identification split) — and are saved in the run directory (`means.npz`). The run is resumable: every
(condition, sample) answer is logged before the next starts; a restart with the same settings skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm  # reference means

from corelens.attention.interventions import HeadMeans, MeanRecorder
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.choices import HEADS_FILLED, OPS
from corelens.data.sample import Sample, read_samples
from corelens.errors import CorelensError, OptionError
from corelens.errors import warn as default_warn
from corelens.experiments.policy_sweep import (  # noqa: F401  (the ranking's readers, public here as before)
    Plan,
    Preset,
    Tables,
    full_heads,
    given_policy,
    heads_settings,
    parameters,
    rank_manifest,
    ranking_data,
    read_heads,
    records_frame,
    resampled_sets,
    same_file_warning,
    sweep_policies,
)
from corelens.experiments.sweep import condition_table, run_on_path, run_sweep, summary_table
from corelens.metrics import draws, kvheads
from corelens.metrics.headsets import SETS, STABLE_P, HeadSet, head_sets, label, parse_k
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare
from corelens.policies import POLICIES, HeadsPolicy, KnockoutHeads, MeanHeads, Policy
from corelens.runs import file_hash
from corelens.runs.context import RunContext
from corelens.runs.outputs import ABLATE

BASELINE = "none"
COLUMNS = [
    "set",
    "k",
    "k_heads",
    "seed",
    "op",
    "keys",
    "accuracy",
    "n",
    "correct",
    "ci_low",
    "ci_high",
    "overlap",
    "short_by",
    "granularity",
    "query_heads",
    "kv_heads",
    "heads",
]


def reference_means(
    m: Loaded, samples: Sequence[Sample], *, progress: bool = False, meta: dict | None = None
) -> HeadMeans:
    """Return every head's mean output per role (visual / text) over the prompts of `samples` (one prefill each)."""
    recorder = MeanRecorder(m)
    with recorder.installed():
        for sample in tqdm(samples, desc="means", unit="sample", disable=not progress):
            prepared = prepare(m, sample)
            inputs = prepared.to(m.device)
            with torch.no_grad(), attention_context(AttentionContext.of(prepared)):
                m.model(**inputs, use_cache=False, logits_to_keep=1)
    info = {"samples": [s.id for s in samples], **(meta or {})}
    return recorder.result(info)


# The fields of a head policy that each head set fills (`Condition.of`); the rest are the policy's parameters.
FILLED = HEADS_FILLED


def template_of(
    policy: Policy | dict | str | None = None, op: str = "zero", keys: str = "visual"
) -> HeadsPolicy:
    """Return the policy every head set of a sweep gets, its heads still empty: `policy` (a head policy, its
    `to_dict` data or JSON text, parameters included) or else operator `op` (knockout: of key set `keys`).

    Examples:
        >>> template_of(op="knockout", keys="omega")
        KnockoutHeads(heads=(), label='', seed=None, meta={}, keys='omega')
        >>> template_of('{"name": "knockout", "keys": "omega"}') == template_of(op="knockout", keys="omega")
        True
        >>> template_of('{"name": "hybrid"}')
        Traceback (most recent call last):
        ...
        corelens.errors.OptionError: --policy: 'hybrid' cannot be swept here; expected one of knockout, mean, uniform, zero
    """
    if policy is None:
        return operator_policy(op, keys, ())
    if (op, keys) != ("zero", "visual"):
        raise OptionError(
            "give the policy as --policy or as --op / --keys, not both (a knockout's key set is a field of the "
            """policy: --policy '{"name": "knockout", "keys": "omega"}')"""
        )
    policy = given_policy(policy, HeadsPolicy, OPS)
    if policy.heads:
        raise OptionError(f"--policy: {policy.name!r} is given heads; a sweep fills them from each head set")
    return policy


@dataclass
class Condition:
    """One evaluated condition: a head set (None for the un-ablated baseline) under the sweep's policy."""

    name: str
    kind: str
    k: str
    count: int
    seed: int | None
    policy: HeadsPolicy  # the sweep's policy on this set (op `mean`: with the prepared statistics)
    overlap: int = 0
    short_by: int = 0  # heads the set lacks to reach `count` (a layer-matched layer ran out of other heads)

    @classmethod
    def of(cls, hs: HeadSet, template: HeadsPolicy) -> Condition:
        """Return the condition applying the sweep's policy `template` to head set `hs`."""
        policy = replace(template, heads=hs.heads, label=hs.name, seed=hs.seed)
        return cls(hs.name, hs.kind, hs.k, hs.count, hs.seed, policy, hs.overlap, hs.short_by)

    @property
    def heads(self) -> tuple[tuple[int, int], ...]:
        """Return the heads ablated (what equal conditions share one generation by)."""
        return self.policy.heads

    def record(self, keys: str) -> dict:
        """Return the condition as headsets.json lists it (name, heads, op, keys, label, seed, meta) with the
        whole policy it answers under (`policy`: its `to_dict`, parameters included)."""
        p = self.policy
        heads = [list(h) for h in p.heads]
        return {"name": self.name, "heads": heads, "op": p.name, "keys": keys, "label": p.label, "seed": p.seed,
                "meta": p.meta, "policy": p.to_dict()}  # fmt: skip


def operator_policy(op: str, keys: str, heads, **data) -> HeadsPolicy:
    """Return the policy of operator `op` (knockout: of key set `keys`) on `heads`."""
    return POLICIES[op](heads, **data, **({"keys": keys} if op == "knockout" else {}))


def conditions(sets: Sequence[HeadSet], template: HeadsPolicy) -> list[Condition]:
    """Return the baseline followed by one condition per head set."""
    base = Condition(BASELINE, BASELINE, "0", 0, None, replace(template, label=BASELINE))
    return [base, *(Condition.of(hs, template) for hs in sets)]


_summary = summary_table  # the sweeps' summary, now in corelens.experiments.sweep


def _table(
    records: pd.DataFrame, conds: Sequence[Condition], op: str, keys: str, group: int = 1, unit: str = "query"
) -> pd.DataFrame:
    """Return ablation.csv: per condition its accuracy; `k_heads` counts the asked rows (query heads, or KV
    heads at `unit` "kv"), `query_heads` the query heads ablated, `kv_heads` the KV heads they touch."""

    def row(c: Condition, got: pd.DataFrame, scores: dict) -> dict:
        return {
            "set": c.kind,
            "k": c.k,
            "k_heads": c.count,
            "seed": c.seed,
            "op": op,
            "keys": keys if op == "knockout" else "",
            **scores,
            "overlap": c.overlap,
            "short_by": c.short_by,
            "granularity": unit,
            "query_heads": len(c.policy.heads),
            "kv_heads": len(kvheads.kv_heads_of(c.policy.heads, group)),
            "heads": label(c.policy.heads),
        }

    return condition_table(records, conds, row, COLUMNS)


@dataclass
class Sweep:
    """An ablation sweep's result: per-condition accuracy (`table`), per-(set, k) `summary`, per-sample `records`."""

    table: pd.DataFrame
    summary: pd.DataFrame
    records: pd.DataFrame
    resampled: pd.DataFrame | None = None


def reference_path(reference: str | Path | None, plan: Plan) -> Path:
    """Return the data of a mean ablation's reference statistics: `reference`, or else the data the rank run
    identified the heads on."""
    return Path(reference) if reference is not None else Path(plan.identified.get("data") or "")


def computes_means(template: HeadsPolicy) -> bool:
    """Return True for a mean ablation whose statistics the run computes from reference data."""
    return isinstance(template, MeanHeads) and template.means is None


def check_reference(template: HeadsPolicy, reference: str | Path | None, plan: Plan) -> None:
    """Op mean: refuse a missing reference (default: the data the rank run identified the heads on)."""
    if not computes_means(template):
        return
    if reference is None and not plan.identified.get("data"):
        raise CorelensError(f"op 'mean' needs --reference (no rank manifest next to {plan.heads})")
    path = reference_path(reference, plan)
    if not path.is_file():
        raise CorelensError(f"{path}: reference data for the mean statistics not found (give --reference)")


def ablate_settings(template: HeadsPolicy, keys: str, reference: str | Path | None, plan: Plan) -> dict:
    """Return the ablation's own manifest settings: the ranking, k, the operator, the draws, the reference."""
    ref = reference_path(reference, plan) if computes_means(template) else None
    seeds = (draws.AUTO if plan.auto else list(range(plan.seeds))) if plan.seeded else []
    # A policy with parameters the operator's name does not say is recorded (only then: runs of the stock
    # operators resume as before); its whole data is the manifest's `policy`.
    plain = operator_policy(template.name, keys, ())
    extra = parameters(template, FILLED) != parameters(plain, FILLED)
    return {
        **heads_settings(plan.heads, plan.identified),
        "k": plan.ks,
        "op": template.name,
        "keys": keys,
        "seeds": seeds,
        "reference": str(ref.resolve()) if ref else None,
        "reference_sha256": file_hash(ref) if ref else None,
        **({"policy": parameters(template, FILLED)} if extra else {}),
    }


def prepare_means(template: HeadsPolicy, reference: str | Path | None, plan: Plan, run) -> dict:
    """Op mean: the reference statistics (`means`), computed once (by rank 0 under torchrun) and kept in the
    run; other operators need nothing."""
    if not computes_means(template):
        return {}
    ref = reference_path(reference, plan)
    stored = ABLATE.path(run.path, "means") if run else None
    means = None
    if stored is None or (run.dist.main and not stored.is_file()):
        # Bad reference records are left out (listed in the metadata) rather than stopping the sweep.
        refs, bad = read_samples(ref, skip_bad=True)
        meta = {
            "reference": str(ref.resolve()),
            "reference_sha256": file_hash(ref),
            "skipped_lines": [b.line for b in bad],
        }
        means = reference_means(plan.m, refs, progress=plan.ctx.progress, meta=meta)
        if stored is not None:
            means.save(stored)
    if stored is not None:
        run.dist.barrier()  # under torchrun rank 0 records the means once; every rank reads them
        means = HeadMeans.load(stored)
    return {"means": means}


def ablate_conditions(template: HeadsPolicy, plan: Plan, ks, kinds, which, resampled=()) -> list[Condition]:
    """Return the baseline and one condition per head set drawn (kinds `kinds` at sizes `ks`, draws `which`)
    and per resampled ranking's set, each under `template` (op mean: with the prepared statistics)."""
    if plan.state.get("means") is not None:
        template = replace(template, means=plan.state["means"])  # statistics in memory: not in the sets file
    sets = head_sets(
        plan.table, ks, kinds, which, base_seed=plan.seed, random_from=plan.random_from,
        stable_p=plan.stable_p, task=plan.task,
    )  # fmt: skip
    # A set of KV heads ablates every query head of each (k, overlap and short_by still count KV heads).
    full = [replace(hs, heads=full_heads(plan.table, hs.heads, plan.m)) for hs in sets]
    return conditions([*full, *resampled], template)


def refuse_without_omega(sample: Sample, prepared: Prepared) -> str | None:
    """Knockout of Ω: return why `sample` cannot be answered (no evidence target), or None."""
    if not sample.targets:
        # A question kept for scoring without evidence (e.g. MMLongBench-Doc "[]"): no Ω to knock out.
        return "no evidence target: knocking out Ω needs one"
    prepared.layout.omega(sample.targets, sample=sample.id)  # bad targets fail here, not mid-sweep
    return None


def ablate_tables(op: str, keys: str, plan: Plan, ok: list[dict], conds) -> Tables:
    """Return the records and ablation.csv."""
    records = records_frame(ok)
    return Tables(records, _table(records, conds, op, keys, plan.group, plan.unit), {})


def dose_figure(op: str, plan: Plan, tables: Tables, paths: dict[str, Path]) -> None:
    """Draw the dose-response figure."""
    from corelens.report.curves import dose_response

    dose_response(
        tables.table,
        paths["dose_response"],
        total_heads=len(plan.table),  # the asked rows' total: query or KV heads
        title=f"{op} ablation on {Path(plan.data).name}",
    )


def ablate_preset(template: HeadsPolicy, keys: str = "visual", reference: str | Path | None = None) -> Preset:
    """Return `corelens ablate` as a policy sweep: each head set gets the policy `template` (`template_of`);
    `keys` is recorded beside the operator (the knockout's own when it is one); `reference`: op mean's data.

    Examples:
        >>> preset = ablate_preset(template_of(op="zero"))
        >>> preset.command, preset.key, preset.size
        ('ablate', 'k', 'k_heads')
    """
    omega = isinstance(template, KnockoutHeads) and template.keys == "omega"
    return Preset(
        "ablate",
        ABLATE,
        "k",
        "k_heads",
        template,
        FILLED,
        conditions=partial(ablate_conditions, template),
        entry=lambda plan, c: c.record(keys),
        tables=partial(ablate_tables, template.name, keys),
        figure=partial(dose_figure, template.name),
        settings=partial(ablate_settings, template, keys, reference),
        check=partial(check_reference, template, reference),
        prepare=partial(prepare_means, template, reference),
        refuse=refuse_without_omega if omega else Preset.refuse,
        warn_unidentified=True,
    )


def sweep(
    m: Loaded,
    data: str | Path,
    heads: str | Path,
    *,
    ks: str | Sequence[str] = ("1%", "2%", "5%", "10%"),
    sets: Sequence[str] = SETS,
    op: str = "zero",
    keys: str = "visual",
    policy: Policy | dict | str | None = None,
    seeds: int | str = draws.AUTO,
    seed: int = 0,
    random_from: str = "all",
    control_width: float = draws.WIDTH,
    max_draws: int = draws.MAX_DRAWS,
    reference: str | Path | None = None,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    warn: Callable[[str], None] = default_warn,
    rank_resamples: int = 0,
    resample: bool = True,
    stable_p: float = STABLE_P,
    granularity: str | None = None,
    ctx: RunContext | None = None,
    **context,
) -> Sweep:
    """Ablate top / bottom / random / layer-matched head sets of `heads` at each k; evaluate on `data`.

    Each set gets `policy` (any registered policy on a set of heads, with its parameters: a `HeadsPolicy`,
    its `to_dict` data or JSON text; `template_of`) or, without one, operator `op` (knockout: of `keys`).
    `rank_resamples` R > 0 adds the top-k set of R bootstrap resamples of the rank run's samples (set
    "top-resampled"; `resampled.csv` holds their median and 90 % interval); `resample=False` is for checks.
    Set "stable" ablates the heads with P(top-k) >= `stable_p`.
    Random and layer-matched sets are drawn for the data's task (`task_of`) and the run `seed`; `seeds` is a
    count of draws, or "auto": draws in batches until the mean over draws is known to `control_width` (95 %
    t-interval) or `max_draws` is reached (`corelens.metrics.draws`; ablation_summary.csv and the manifest
    say which, and how wide).
    `granularity` "kv" draws sets of KV heads (k counts them) and ablates all their query heads; None: the
    heads.csv's own granularity (docs/methods.md#kv-heads).
    `ctx` is the run (`RunContext`: `out`, `skip_bad`, `limit`, `limits`, `progress`, `argv`), whose fields
    may also be given as keywords.
    The sweep is `corelens.experiments.policy_sweep`'s, with `ablate_preset`.
    """
    template = template_of(policy, op, keys)
    swept = sweep_policies(
        ablate_preset(template, template.keys if isinstance(template, KnockoutHeads) else keys, reference),
        m, data, heads, ks=parse_k(ks), granularity=granularity,
        warn=warn, sets=list(sets), seeds=seeds, seed=seed, random_from=random_from, stable_p=stable_p,
        control_width=control_width, max_draws=max_draws, rank_resamples=rank_resamples, resample=resample,
        scorer=scorer, max_new_tokens=max_new_tokens, ctx=RunContext.of(ctx, **context),
    )  # fmt: skip
    return Sweep(swept.table, swept.summary, swept.records, swept.resampled)


# Load a model from its path (or hub id) and run an ablation sweep into a run directory; `corelens ablate`.
sweep_path = partial(run_on_path, sweep)


def run_command(config, ctx, load_options: dict):
    """`corelens ablate`: the policy checked (its fields, --policy beside --op) before the model loads."""
    template_of(config.policy, config.op, config.keys)
    return run_sweep(sweep, config, ctx, load_options)
