"""Ablation sweep: head sets from a rank run x k -> greedy accuracy per set -> ablation.csv + dose-response figure.

Heads are identified on one file (the rank run) and evaluated on another; the sweep warns when both are the
same file (by sha256). `mean` statistics come from a reference file only — by default the rank run's own data
(the identification split) — and are saved in the run directory (`means.npz`). The run is resumable: every
(condition, sample) answer is logged before the next starts; a restart with the same settings skips them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm  # reference means

from corelens.attention.interventions import HeadMeans, MeanRecorder
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample, read_samples, task_of
from corelens.errors import CorelensError, InputError, OptionError
from corelens.errors import warn as default_warn
from corelens.experiments.evaluate import interval, score
from corelens.experiments.sweep import Tail, conclude_sweep, run_sweep, summary_table
from corelens.heads.artifact import check_heads, check_table, csv_line, read_table
from corelens.metrics import draws, kvheads
from corelens.metrics.headsets import (
    SEEDED,
    SETS,
    STABLE_P,
    HeadSet,
    head_sets,
    k_count,
    label,
    parse_k,
    select,
)
from corelens.metrics.ram import read_ram
from corelens.metrics.uncertainty import RESAMPLED, resampled_tables
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.policies import POLICIES, HeadsPolicy, answer
from corelens.runs import MANIFEST, file_hash, model_data_settings, write_json
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop, ordered
from corelens.runs.outputs import ABLATE, RANK

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


@dataclass
class Condition:
    """One evaluated condition: a head set (None for the un-ablated baseline) under the sweep's operator."""

    name: str
    kind: str
    k: str
    count: int
    seed: int | None
    policy: HeadsPolicy  # the operator's policy (op `mean`: its statistics are given at answer time)
    overlap: int = 0
    short_by: int = 0  # heads the set lacks to reach `count` (a layer-matched layer ran out of other heads)

    @classmethod
    def of(cls, hs: HeadSet, op: str, keys: str) -> Condition:
        """Return the condition ablating head set `hs` with `op`."""
        policy = operator_policy(op, keys, hs.heads, label=hs.name, seed=hs.seed)
        return cls(hs.name, hs.kind, hs.k, hs.count, hs.seed, policy, hs.overlap, hs.short_by)

    def record(self, op: str, keys: str) -> dict:
        """Return the condition as headsets.json lists it (name, heads, op, keys, label, seed, meta)."""
        p = self.policy
        heads = [list(h) for h in p.heads]
        return {"name": self.name, "heads": heads, "op": op, "keys": keys, "label": p.label, "seed": p.seed,
                "meta": p.meta}  # fmt: skip


def operator_policy(op: str, keys: str, heads, **data) -> HeadsPolicy:
    """Return the policy of operator `op` (knockout: of key set `keys`) on `heads`."""
    return POLICIES[op](heads, **data, **({"keys": keys} if op == "knockout" else {}))


def conditions(sets: Sequence[HeadSet], op: str, keys: str) -> list[Condition]:
    """Return the baseline followed by one condition per head set."""
    base = Condition(BASELINE, BASELINE, "0", 0, None, operator_policy(op, keys, (), label=BASELINE))
    return [base, *(Condition.of(hs, op, keys) for hs in sets)]


def read_heads(path: str | Path, m: Loaded, granularity: str | None = None) -> pd.DataFrame:
    """Return a rank run's head table, checked against the model's shape, at `granularity`.

    None keeps the table's own (query heads, or KV heads for `rank --granularity kv`); "kv" turns a query
    table into a KV table (`corelens.metrics.kvheads.kv_table`: the members' masses summed); "query" refuses
    a KV table, whose scores cannot be split among query heads.
    """
    path = Path(path)
    if not path.is_file():
        raise CorelensError(f"{path}: no such head table (expected a rank run's heads.csv)")
    check_heads(path, m)  # an exported head set: the model must have its config
    table = read_table(path)
    own = kvheads.granularity_of(table)
    per_layer = m.num_kv_heads if own == "kv" else m.num_heads
    try:
        # Integers in the model's range, each head once, finite ranks; named by the line at fault.
        table = check_table(table, m.num_layers, per_layer, csv_line)
    except CorelensError as err:
        unit = "KV heads" if own == "kv" else "heads"
        raise CorelensError(
            f"{path}: {err} (the model has {m.num_layers} layers x {per_layer} {unit})"
        ) from None
    if granularity is None or granularity == own:
        return table
    if kvheads.check_granularity(granularity) == "query":
        raise OptionError(
            f"--granularity query: {path} ranks KV heads (rank --granularity kv); their scores cannot be "
            "split among query heads: rank again with --granularity query, or use --granularity kv"
        )
    return kvheads.kv_table(table, kvheads.group_size(m.num_heads, m.num_kv_heads))


def full_heads(
    table: pd.DataFrame, rows: Sequence[tuple[int, int]], m: Loaded
) -> tuple[tuple[int, int], ...]:
    """Return the query heads of `rows` of a head table: the rows themselves, or every member of KV rows."""
    if kvheads.granularity_of(table) != "kv":
        return tuple(rows)
    return kvheads.expand(rows, kvheads.group_size(m.num_heads, m.num_kv_heads))


def ranking_data(heads: str | Path) -> pd.DataFrame:
    """Return the per-sample RAM table (`ram.parquet`) of the rank run that wrote `heads`."""
    path = RANK.path(Path(heads).parent, "ram")
    if not path.is_file():
        raise CorelensError(f"--rank-resamples needs the rank run's ram.parquet next to {heads}")
    return read_ram(path)


def resampled_sets(
    heads: str | Path,
    ks: Sequence[str],
    r: int,
    seed: int,
    *,
    resample: bool = True,
    group: int | None = None,
) -> list[HeadSet]:
    """Return the top-k set of each of `r` bootstrap resamples of the ranking data, for each k.

    The set is `RESAMPLED`, its seed the resample's index; `overlap` counts heads shared with the top-k of the
    full ranking. `resample=False` ranks every draw on all samples (the plain top-k, for checking).
    `group` (query heads per KV head) ranks KV heads (members' mass summed); k and `overlap` count KV heads
    and each set holds their query heads.
    """
    ram = ranking_data(heads)
    if group is not None:
        ram = kvheads.kv_frame(ram, group)
    tables = resampled_tables(ram, r, seed, resample=resample)
    full = resampled_tables(ram, 1, seed, resample=False)[0]
    out = []
    for k in ks:
        count = k_count(k, len(full))
        top = set(select(full, "top", count))
        for i, table in enumerate(tables):
            chosen = select(table, "top", count)
            members = chosen if group is None else kvheads.expand(chosen, group)
            out.append(HeadSet(RESAMPLED, str(k), count, i, members, len(top & set(chosen))))
    return out


def heads_settings(heads: str | Path, identified: dict) -> dict:
    """Return the manifest settings naming a head table and the data its rank run (`rank_manifest`) used."""
    return {
        "heads": str(Path(heads).resolve()),
        "heads_sha256": file_hash(heads),
        "identified_on": identified.get("data"),
        "identified_sha256": identified.get("data_sha256"),
    }


def rank_manifest(heads: str | Path) -> dict:
    """Return the settings of the rank run that wrote `heads` (empty when its manifest.json is missing)."""
    path = Path(heads).parent / MANIFEST
    if not path.is_file():
        return {}
    return json.loads(path.read_text()).get("settings", {})


def same_file_warning(data: str | Path, identified: dict) -> str | None:
    """Return a warning when `data` is the file the heads were identified on (same sha256 or same path)."""
    if not identified.get("data"):
        return None
    same_hash = identified.get("data_sha256") == file_hash(data)
    same_path = Path(identified["data"]).resolve() == Path(data).resolve()
    if same_hash or same_path:
        return (
            f"the heads were identified on the same data ({identified['data']}) as they are evaluated on "
            f"({data}); use a disjoint split for a causal claim"
        )
    return None


_summary = summary_table  # the sweeps' summary, now in corelens.experiments.sweep (hybrid imports it here)


def _table(
    records: pd.DataFrame, conds: Sequence[Condition], op: str, keys: str, group: int = 1, unit: str = "query"
) -> pd.DataFrame:
    """Return ablation.csv: per condition its accuracy; `k_heads` counts the asked rows (query heads, or KV
    heads at `unit` "kv"), `query_heads` the query heads ablated, `kv_heads` the KV heads they touch."""
    rows = []
    for c in conds:
        got = records[records["condition"] == c.name]
        n, correct = len(got), int(got["correct"].sum()) if len(got) else 0
        low, high = interval(correct, n)
        rows.append(
            {
                "set": c.kind,
                "k": c.k,
                "k_heads": c.count,
                "seed": c.seed,
                "op": op,
                "keys": keys if op == "knockout" else "",
                "accuracy": correct / n if n else float("nan"),
                "n": n,
                "correct": correct,
                "ci_low": low,
                "ci_high": high,
                "overlap": c.overlap,
                "short_by": c.short_by,
                "granularity": unit,
                "query_heads": len(c.policy.heads),
                "kv_heads": len(kvheads.kv_heads_of(c.policy.heads, group)),
                "heads": label(c.policy.heads),
            }
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["seed"] = table["seed"].astype("Int64")
    return table


@dataclass
class Sweep:
    """An ablation sweep's result: per-condition accuracy (`table`), per-(set, k) `summary`, per-sample `records`."""

    table: pd.DataFrame
    summary: pd.DataFrame
    records: pd.DataFrame
    resampled: pd.DataFrame | None = None


def sweep(
    m: Loaded,
    data: str | Path,
    heads: str | Path,
    *,
    ks: str | Sequence[str] = ("1%", "2%", "5%", "10%"),
    sets: Sequence[str] = SETS,
    op: str = "zero",
    keys: str = "visual",
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
    """
    ctx = RunContext.of(ctx, **context)
    ks = parse_k(ks)
    table = read_heads(heads, m, granularity)
    unit, group = kvheads.granularity_of(table), kvheads.group_size(m.num_heads, m.num_kv_heads)
    identified = rank_manifest(heads)
    warning = same_file_warning(data, identified)
    if not identified:
        warning = f"no rank manifest.json next to {heads}: cannot check that the heads were identified on other data"
    if warning:
        warn(warning)
    seeded = [s for s in sets if s in SEEDED]
    draws.check(seeds, control_width, max_draws)
    auto = seeds == draws.AUTO
    samples, skipped = ctx.read(data)
    missing = [s.id for s in samples if s.answer is None]
    if missing:
        raise InputError(
            f"{len(missing)} sample(s) have no answer to score against", file=str(data), sample=missing[0]
        )
    task = task_of(samples, data)

    def drawn(ks: Sequence[str], kinds: Sequence[str], which) -> list[HeadSet]:
        sets_ = head_sets(
            table, ks, kinds, which, base_seed=seed, random_from=random_from, stable_p=stable_p, task=task
        )
        # A set of KV heads ablates every query head of each (k, overlap and short_by still count KV heads).
        return [replace(hs, heads=full_heads(table, hs.heads, m)) for hs in sets_]

    chosen = drawn(ks, sets, draws.first_draws(seeds, max_draws))
    if rank_resamples:
        by_kv = group if unit == "kv" else None
        chosen += resampled_sets(heads, ks, rank_resamples, seed, resample=resample, group=by_kv)
    conds = conditions(chosen, op, keys)

    ref_path = None
    if op == "mean":
        ref_path = Path(reference) if reference is not None else Path(identified.get("data") or "")
        if reference is None and not identified.get("data"):
            raise CorelensError(f"op 'mean' needs --reference (no rank manifest next to {heads})")
        if not ref_path.is_file():
            raise CorelensError(
                f"{ref_path}: reference data for the mean statistics not found (give --reference)"
            )

    run = None
    if ctx.out is not None:
        settings = {
            **model_data_settings(m, data),
            **heads_settings(heads, identified),
            "k": ks,
            "sets": list(sets),
            "op": op,
            "keys": keys,
            "seeds": (draws.AUTO if auto else list(range(seeds))) if seeded else [],
            "seed": seed,
            "task": task,
            "random_from": random_from,
            "reference": str(ref_path.resolve()) if ref_path else None,
            "reference_sha256": file_hash(ref_path) if ref_path else None,
            "scorer": scorer,
            "max_new_tokens": max_new_tokens,
            "limit": ctx.limit,
            "skip_bad": ctx.skip_bad,
        }
        # Recorded only when used, so that runs without them resume as before.
        if rank_resamples:
            settings.update(rank_resamples=rank_resamples, resample=resample)
        if "stable" in sets:
            settings["stable_p"] = stable_p
        if unit == "kv":
            settings["granularity"] = unit
        if auto and seeded:
            settings.update(control_width=control_width, max_draws=max_draws)
        run = ctx.open("ablate", settings, device=m.device)
        if warning and run.dist.main:
            run.manifest.setdefault("warnings", [])
            if warning not in run.manifest["warnings"]:
                run.manifest["warnings"].append(warning)

    def record_sets() -> None:
        if run is not None and run.dist.main:
            write_json(
                ABLATE.path(run.path, "sets"),
                [c.record(op, keys) for c in conds],
                root=run.path,
            )

    record_sets()

    means = None
    if op == "mean":
        stored = ABLATE.path(run.path, "means") if run else None
        if stored is None or (run.dist.main and not stored.is_file()):
            # Bad reference records are left out (listed in the metadata) rather than stopping the sweep.
            refs, bad = read_samples(ref_path, skip_bad=True)
            meta = {
                "reference": str(ref_path.resolve()),
                "reference_sha256": file_hash(ref_path),
                "skipped_lines": [b.line for b in bad],
            }
            means = reference_means(m, refs, progress=ctx.progress, meta=meta)
            if stored is not None:
                means.save(stored)
        if stored is not None:
            run.dist.barrier()  # under torchrun rank 0 records the means once; every rank reads them
            means = HeadMeans.load(stored)

    def step(sample: Sample, done: set[str], prepared: Prepared) -> Iterator[dict]:
        if op == "knockout" and keys == "omega" and not sample.targets:
            # A question kept for scoring without evidence (e.g. MMLongBench-Doc "[]"): no Ω to knock out.
            reason = "no evidence target: knocking out Ω needs one"
            yield {"id": f"skipped|{sample.id}", "status": "skipped", "line": sample.line, "reason": reason}
            return
        if op == "knockout" and keys == "omega":
            prepared.layout.omega(sample.targets, sample=sample.id)  # bad targets fail here, not mid-sweep
        answers: dict[tuple, str] = {}  # equal head sets share one generation
        for c in conds:
            if f"{c.name}|{sample.id}" in done or f"{c.name}|{sample.id}" in have:
                continue
            if c.policy.heads not in answers:
                policy = replace(c.policy, means=means) if op == "mean" else c.policy
                answers[c.policy.heads] = answer(
                    m, prepared, policy, sample=sample, max_new_tokens=max_new_tokens
                )
            prediction = answers[c.policy.heads]
            yield {
                "id": f"{c.name}|{sample.id}",
                "status": "ok",
                "condition": c.name,
                "sample": sample.id,
                "task": sample.task,
                "prediction": prediction,
                "gold": sample.answer,
                "correct": score(prediction, sample.answer, sample.choices, scorer),
            }

    loop = Loop(
        "ablate",
        step,
        keys=lambda s: [f"{c.name}|{s.id}" for c in conds],
        skip_key=lambda s: f"skipped|{s.id}",
        length=partial(prompt_length, m),
        prepare=partial(prepare, m),
    )
    have: dict[str, dict] = {}  # records of earlier rounds (a run without --out keeps them only here)
    columns = ["condition", "sample", "task", "prediction", "gold", "correct"]

    def evaluate() -> tuple[list[dict], pd.DataFrame, pd.DataFrame]:
        got = ctx.drive(loop, samples, run, skipped)
        have.update((r["id"], r) for r in got)
        logged = ordered(loop, samples, have.values())
        ok = [r for r in logged if r["status"] == "ok"]
        records = pd.DataFrame([{k: r[k] for k in columns} for r in ok], columns=columns)
        return logged, records, _table(records, conds, op, keys, group, unit)

    logged, records, result_table = evaluate()
    # --seeds auto: more draws, a batch at a time, for every control still wider than the target. Each
    # choice follows from the logged answers, so a resumed run draws the same sets.
    found = draws.controls(result_table, "k", control_width, max_draws, auto)
    while any(c.stopped == "more" for c in found):
        batch = [hs for c in found for hs in drawn([c.k], [c.kind], draws.more(c, max_draws))]
        if not batch:
            break  # nothing left to draw (cannot happen while `more` and `status` agree on the cap)
        conds.extend(Condition.of(hs, op, keys) for hs in batch)
        record_sets()
        logged, records, result_table = evaluate()
        found = draws.controls(result_table, "k", control_width, max_draws, auto)
    names = {(c.kind, c.k, c.seed): c.name for c in conds}
    tail = Tail(
        ABLATE,
        result_table,
        records,
        names,
        found,
        task,
        seed,
        "k",
        "k_heads",
        control_width,
        max_draws,
        auto,
    )
    resampled_sets_ = (
        [(c.k, c.policy.heads) for c in conds if c.kind == RESAMPLED] if rank_resamples else None
    )

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.curves import dose_response

        dose_response(
            result_table,
            paths["dose_response"],
            total_heads=len(table),  # the asked rows' total: query or KV heads
            title=f"{op} ablation on {Path(data).name}",
        )

    n_skipped = sum(1 for r in logged if r["status"] == "skipped")
    finish = {"samples": len(samples), "conditions": len(conds), "skipped": n_skipped}
    summary, resampled = conclude_sweep(run, tail, resampled_sets_, draw=draw, **finish)
    return Sweep(result_table, summary, records, resampled)


def sweep_path(
    model: str | Path,
    data: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    load_options: dict | None = None,
    **kwargs,
) -> Sweep:
    """Load `model` (with `load()`'s `load_options`) and run an ablation sweep into run directory `out`."""
    return sweep(load(model, **(load_options or {})), data, heads, out=out, **kwargs)


def run_command(config, ctx: RunContext, load_options: dict) -> Sweep:
    """`corelens ablate`: the generic sweep command (`experiments.sweep.run_sweep`) running `sweep`."""
    return run_sweep(sweep, config, ctx, load_options)
