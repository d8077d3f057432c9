"""One sweep over policies: head sets drawn from a ranking, each applied as a registered policy while answering.

`corelens ablate` and `corelens hybrid` are one driver (`PolicySweep`) given a `Preset`: a frozen dataclass
of a policy template, a few values (the command, its outputs, the table's size columns) and a few callables
(the conditions a head set makes, what to prepare before the loop, what to record per answer, the tables,
the figure); `corelens.experiments.ablate.ablate_preset` and `corelens.experiments.hybrid.hybrid_preset`
build theirs. The driver owns the rest once: the heads read and checked, the samples read (each must have an
answer), the run opened with the common settings and the template's parameters, the sets written, the
per-sample step that answers every condition from the one prepared sample (conditions with one policy
class on one head set share one generation: `answer_each`), the `--seeds auto` rounds that draw more
controls, and the tail (`corelens.experiments.sweep.conclude_sweep`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from corelens.data.sample import Sample, task_of
from corelens.errors import CorelensError, InputError, OptionError
from corelens.experiments.sweep import Tail, conclude_sweep
from corelens.heads.artifact import check_heads, check_table, csv_line, read_table
from corelens.metrics import draws, kvheads
from corelens.metrics.answers import score
from corelens.metrics.headsets import SEEDED, HeadSet, k_count, select
from corelens.metrics.ram import read_ram
from corelens.metrics.uncertainty import RESAMPLED, resampled_tables
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.policies import Policy, answer
from corelens.runs import MANIFEST, file_hash, model_data_settings, write_json
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop, ordered
from corelens.runs.outputs import RANK
from corelens.runs.rundir import Run

# The ranking a sweep reads: its head table, its rank run's settings and resampled top-k sets.


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


def given_policy(policy: Policy | dict | str, base: type, choices: Sequence[str]) -> Policy:
    """Return a sweep's `--policy` (a policy, its `to_dict` data or JSON text) as a policy of class `base`,
    its fields checked (`Policy.from_dict`); one line naming the option when it is not one."""
    if isinstance(policy, str):
        policy = Policy.from_json(policy, "--policy")
    elif isinstance(policy, dict):
        policy = Policy.from_dict(policy, "--policy")
    if not isinstance(policy, base):
        raise OptionError(
            f"--policy: {policy.name!r} cannot be swept here; expected one of {', '.join(choices)}"
        )
    return policy


def parameters(policy: Policy, filled: Sequence[str]) -> dict:
    """Return the policy as data without the fields a sweep fills per head set: its name and parameters."""
    return {k: v for k, v in policy.to_dict().items() if k not in filled}


def answer_each(
    m: Loaded,
    prepared: Prepared,
    sample: Sample,
    todo: Iterable[tuple[Hashable, Policy | None]],
    *,
    max_new_tokens: int,
) -> Iterator[tuple[str, dict]]:
    """Yield (answer, what its policy measured) for each (share key, policy) of `todo`, in order, all from the
    one prepared sample; conditions with equal share keys (the same policy) share one generation."""
    got: dict[Hashable, tuple[str, dict]] = {}
    for key, policy in todo:
        if key not in got:
            stats: dict = {}
            text = answer(m, prepared, policy, sample=sample, max_new_tokens=max_new_tokens, stats=stats)
            got[key] = (text, stats)
        yield got[key]


@dataclass
class Plan:
    """What a preset reads of a sweep: its model, data, ranking and common settings, resolved once; `state` is
    what the preset's `prepare` returned (`lengths`: each sample's prompt length, when it measured them)."""

    m: Loaded
    data: str | Path
    heads: str | Path
    table: pd.DataFrame  # the head table at the sweep's granularity
    unit: str  # "query" or "kv": what the table's rows (and k) count
    group: int  # query heads per KV head
    identified: dict  # the rank run's settings (empty without its manifest)
    ks: list[str]
    sets: list[str]
    seeds: int | str
    seed: int
    random_from: str
    stable_p: float
    control_width: float
    max_draws: int
    rank_resamples: int
    resample: bool
    scorer: str
    max_new_tokens: int
    ctx: RunContext
    samples: list[Sample] = field(default_factory=list)
    task: str = ""
    state: dict = field(default_factory=dict)

    @property
    def auto(self) -> bool:
        """Return True when the controls are drawn until their mean is known (`--seeds auto`)."""
        return self.seeds == draws.AUTO

    @property
    def seeded(self) -> list[str]:
        """Return the swept sets that are drawn (random, layer-matched)."""
        return [s for s in self.sets if s in SEEDED]


RECORD = ["condition", "sample", "task", "prediction", "gold", "correct"]


def records_frame(ok: Sequence[dict], columns: Sequence[str] = RECORD) -> pd.DataFrame:
    """Return the answers `ok` as records.parquet holds them: their `columns`, in order."""
    return pd.DataFrame([{k: r[k] for k in columns} for r in ok], columns=list(columns))


class Tables(NamedTuple):
    """What a preset makes of the answers: `records` (records.parquet), the per-condition `table` and the
    entries the tail adds to the manifest."""

    records: pd.DataFrame
    table: pd.DataFrame
    manifest: dict


def _nothing(*args: Any) -> None:
    """A preset's step that does nothing (the default of `check`, `refuse`)."""
    return None


def _no_settings(plan: Plan) -> dict:
    return {}


def _no_state(plan: Plan, run: Run | None) -> dict:
    return {}


def _own_policy(plan: Plan, c: Any) -> Policy | None:
    return c.policy


def _nothing_measured(prepared: Prepared, stats: dict) -> dict:
    return {}


@dataclass(frozen=True)
class Preset:
    """What one experiment makes of the policy sweep (the module docstring): values, and callables given the
    `Plan`.

    A condition (the preset's own type) has `name`, `kind`, `k`, `seed` and `heads` (the head set, None for a
    dense baseline). Required: `conditions(plan, ks, kinds, which, resampled)` returns the baseline, then one
    condition per head set of `kinds` at sizes `ks` (draws `which` of the seeded kinds), then one per
    resampled ranking's set (later rounds of `--seeds auto` drop the baseline); `entry(plan, c)` is `c` as the
    run's sets file lists it; `tables(plan, answers, conds)` returns the `Tables`; `figure(plan, tables,
    paths)` draws into the outputs' figure paths. Optional: `settings(plan)`, the preset's own manifest
    settings; `check(plan)` refuses what the resolved plan cannot run (before the run is opened);
    `prepare(plan, run)` returns what the loop needs (`Plan.state`; `lengths`, each sample's prompt length,
    balances the ranks) and may add manifest entries; `policy(plan, c)` is the registered policy `c` answers
    under (default: `c.policy`; None: the model as it is); `refuse(sample, prepared)` says why a sample is
    skipped (None: answered); `record(prepared, stats)` returns a record's fields beyond `RECORD`'s (of the
    prepared sample and what the policy measured while answering), those named in `before` placed before
    the prediction.
    """

    command: str  # the run's command and the loop's name
    outputs: Any  # corelens.runs.outputs.Outputs
    key: str  # the size column of the table: "k" or "keep"
    size: str  # its head-count column
    template: Policy  # the policy each head set fills; the manifest's `policy` is its name and parameters
    filled: Sequence[str]  # the template's fields a head set fills (`parameters` leaves them out)
    conditions: Callable[..., list]
    entry: Callable[[Plan, Any], dict]
    tables: Callable[[Plan, list[dict], Sequence], Tables]
    figure: Callable[[Plan, Tables, dict[str, Path]], None]
    settings: Callable[[Plan], dict] = _no_settings
    check: Callable[[Plan], None] = _nothing
    prepare: Callable[[Plan, Run | None], dict] = _no_state
    policy: Callable[[Plan, Any], Policy | None] = _own_policy
    refuse: Callable[[Sample, Prepared], str | None] = _nothing
    record: Callable[[Prepared, dict], dict] = _nothing_measured
    before: Sequence[str] = ()
    warn_unidentified: bool = False  # also warn when no rank manifest says which data the heads came from


@dataclass
class Swept:
    """What a sweep found: per-condition `table`, per-(set, k) `summary`, per-answer `records`, the
    summary over ranking resamples (None without them), the manifest entries of the preset's tables and
    what its `prepare` returned."""

    table: pd.DataFrame
    summary: pd.DataFrame
    records: pd.DataFrame
    resampled: pd.DataFrame | None
    manifest: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)


class PolicySweep:
    """The driver: `run()` sweeps a preset's conditions over the data (module docstring)."""

    def __init__(self, preset: Preset, plan: Plan, warn: Callable[[str], None]) -> None:
        self.preset, self.plan, self.warn = preset, plan, warn
        self.run_: Run | None = None
        self.conds: list = []
        self.have: dict[
            str, dict
        ] = {}  # records of earlier rounds (a run without --out keeps them only here)

    def say(self, text: str) -> None:
        """Print a line about the sweep's progress on standard error (with progress shown, main process)."""
        if self.plan.ctx.progress and (self.run_ is None or self.run_.dist.main):
            print(text, file=sys.stderr, flush=True)

    def warning(self) -> str | None:
        """Return (and give) the warning that the heads were identified on the evaluated data, if any."""
        plan = self.plan
        text = same_file_warning(plan.data, plan.identified)
        if not plan.identified and self.preset.warn_unidentified:
            text = f"no rank manifest.json next to {plan.heads}: cannot check that the heads were identified on other data"
        if text:
            self.warn(text)
        return text

    def read(self) -> tuple[list[Sample], list]:
        """Read the samples; refuse those without an answer to score against."""
        plan = self.plan
        samples, skipped = plan.ctx.read(plan.data)
        missing = [s.id for s in samples if s.answer is None]
        if missing:
            raise InputError(
                f"{len(missing)} sample(s) have no answer to score against",
                file=str(plan.data),
                sample=missing[0],
            )
        plan.samples, plan.task = samples, task_of(samples, plan.data)
        return samples, skipped

    def open(self, warning: str | None) -> Run | None:
        """Open the run folder with the sweep's settings (None without `out`)."""
        plan, preset = self.plan, self.preset
        if plan.ctx.out is None:
            return None
        settings = {
            **model_data_settings(plan.m, plan.data),
            **preset.settings(plan),
            "sets": list(plan.sets),
            "seed": plan.seed,
            "task": plan.task,
            "random_from": plan.random_from,
            "scorer": plan.scorer,
            "max_new_tokens": plan.max_new_tokens,
            "limit": plan.ctx.limit,
            "skip_bad": plan.ctx.skip_bad,
        }
        # Recorded only when used, so that runs without them resume as before.
        if plan.rank_resamples:
            settings.update(rank_resamples=plan.rank_resamples, resample=plan.resample)
        if "stable" in plan.sets:
            settings["stable_p"] = plan.stable_p
        if plan.unit == "kv":
            settings["granularity"] = plan.unit
        if plan.auto and plan.seeded:
            settings.update(control_width=plan.control_width, max_draws=plan.max_draws)
        run = plan.ctx.open(preset.command, settings, device=plan.m.device)
        if run.dist.main:
            if warning and warning not in run.manifest.setdefault("warnings", []):
                run.manifest["warnings"].append(warning)
            # The policy every set gets: its name and parameters (the fields a set fills left out).
            run.manifest["policy"] = parameters(preset.template, preset.filled)
        return run

    def record_sets(self) -> None:
        """Write the conditions into the run's sets file (again after each round of draws)."""
        run = self.run_
        if run is None or not run.dist.main:
            return
        entries = [self.preset.entry(self.plan, c) for c in self.conds]
        write_json(self.preset.outputs.path(run.path, "sets"), entries, root=run.path)

    def step(self, sample: Sample, done: set[str], prepared: Prepared) -> Iterator[dict]:
        """Answer every condition not yet logged for `sample` from the one prepared prompt."""
        preset, plan = self.preset, self.plan
        reason = preset.refuse(sample, prepared)
        if reason is not None:
            yield {"id": f"skipped|{sample.id}", "status": "skipped", "line": sample.line, "reason": reason}
            return
        keys = [f"{c.name}|{sample.id}" for c in self.conds]
        todo = [c for c, key in zip(self.conds, keys) if key not in done and key not in self.have]
        policies = [preset.policy(plan, c) for c in todo]
        # One generation per policy class and head set: the conditions that differ only in name share it.
        pairs = (((type(p), c.heads), p) for c, p in zip(todo, policies))
        got = answer_each(plan.m, prepared, sample, pairs, max_new_tokens=plan.max_new_tokens)
        for c, (prediction, stats) in zip(todo, got):
            extra = preset.record(prepared, stats)
            yield {
                "id": f"{c.name}|{sample.id}",
                "status": "ok",
                "condition": c.name,
                "sample": sample.id,
                "task": sample.task,
                **{k: extra.pop(k) for k in preset.before},
                "prediction": prediction,
                "gold": sample.answer,
                "correct": score(prediction, sample.answer, sample.choices, plan.scorer),
                **extra,
            }

    def evaluate(self, loop: Loop, skipped) -> tuple[list[dict], list[dict], Tables]:
        """Drive the loop; return the records logged (all rounds), the answers and the preset's tables."""
        plan = self.plan
        got = plan.ctx.drive(loop, plan.samples, self.run_, skipped)
        self.have.update((r["id"], r) for r in got)
        logged = ordered(loop, plan.samples, self.have.values())
        ok = [r for r in logged if r.get("status") == "ok"]
        return logged, ok, self.preset.tables(plan, ok, self.conds)

    def run(self) -> Swept:
        """Sweep: first draws, then (--seeds auto) more draws of each control still too wide; the tail."""
        plan, preset = self.plan, self.preset
        warning = self.warning()
        samples, skipped = self.read()
        resampled = []
        if plan.rank_resamples:
            by_kv = plan.group if plan.unit == "kv" else None
            resampled = resampled_sets(
                plan.heads, plan.ks, plan.rank_resamples, plan.seed, resample=plan.resample, group=by_kv
            )
        self.run_ = run = self.open(warning)
        plan.state = preset.prepare(plan, run)
        first = draws.first_draws(plan.seeds, plan.max_draws)
        self.conds = preset.conditions(plan, plan.ks, plan.sets, first, resampled)
        self.record_sets()
        kinds = ", ".join(dict.fromkeys(c.kind for c in self.conds[1:])) or "none"
        ks = ", ".join(dict.fromkeys(str(c.k) for c in self.conds[1:])) or "-"
        self.say(f"{preset.command}: {len(self.conds)} conditions (the model as it is; sets {kinds} at "
                 f"{preset.key} {ks}) x {len(samples)} samples")  # fmt: skip
        lengths = plan.state.get("lengths")
        loop = Loop(
            preset.command,
            self.step,
            keys=lambda s: [f"{c.name}|{s.id}" for c in self.conds],
            skip_key=lambda s: f"skipped|{s.id}",
            length=partial(prompt_length, plan.m) if lengths is None else lambda s: lengths[s.id] or 0,
            prepare=partial(prepare, plan.m),
        )
        logged, ok, tables = self.evaluate(loop, skipped)
        # --seeds auto: more draws, a batch at a time, for every control still wider than the target. Each
        # choice follows from the logged answers, so a resumed run draws the same sets.
        width, most = plan.control_width, plan.max_draws
        found = draws.controls(tables.table, preset.key, width, most, plan.auto)
        while any(c.stopped == "more" for c in found):
            batch = [
                b
                for c in found
                for b in preset.conditions(plan, [c.k], [c.kind], draws.more(c, most), ())[1:]
            ]
            if not batch:
                break  # nothing left to draw (cannot happen while `more` and `status` agree on the cap)
            wide = ", ".join(dict.fromkeys(f"{c.kind}/{c.k}" for c in batch))
            self.say(f"{preset.command}: --draws auto: {len(batch)} more draws of {wide} (their mean over draws "
                     f"is not yet known within --control-width {width:g})")  # fmt: skip
            self.conds.extend(batch)
            self.record_sets()
            logged, ok, tables = self.evaluate(loop, skipped)
            found = draws.controls(tables.table, preset.key, width, most, plan.auto)
        names = {(c.kind, c.k, c.seed): c.name for c in self.conds}
        table, records = tables.table, tables.records
        tail = Tail(preset.outputs, table, records, names, found, plan.task, plan.seed, preset.key,
                    preset.size, width, most, plan.auto)  # fmt: skip
        over = [(c.k, c.heads) for c in self.conds if c.kind == RESAMPLED] if plan.rank_resamples else None
        n_skipped = sum(1 for r in logged if r.get("status") == "skipped")
        finish = {"samples": len(samples), "conditions": len(self.conds), "skipped": n_skipped}
        summary, resampled_ = conclude_sweep(
            run,
            tail,
            over,
            draw=partial(preset.figure, plan, tables),
            manifest=tables.manifest,
            **finish,
        )
        return Swept(table, summary, records, resampled_, tables.manifest, plan.state)


def sweep_policies(
    preset: Preset,
    m: Loaded,
    data: str | Path,
    heads: str | Path,
    *,
    ks: Sequence[str],
    granularity: str | None,
    warn: Callable[[str], None],
    **common: Any,
) -> Swept:
    """Run `preset`'s sweep of `heads`' sets at sizes `ks` on `data` (`common`: the rest of `Plan`'s fields)."""
    draws.check(common["seeds"], common["control_width"], common["max_draws"])
    table = read_heads(heads, m, granularity)
    unit, group = kvheads.granularity_of(table), kvheads.group_size(m.num_heads, m.num_kv_heads)
    plan = Plan(m, data, heads, table, unit, group, rank_manifest(heads), list(ks), **common)
    preset.check(plan)
    return PolicySweep(preset, plan, warn).run()
