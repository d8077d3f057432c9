"""Hybrid-attention accuracy curve: full sets of CoRe / random / bottom heads x kept fraction -> hybrid.csv + figure.

For each kept fraction `k`, the full set is the top-k heads of a rank run (CoRe), k random heads (several
seeds, drawn from all heads or, with `random_from="non-top"`, outside the top-k, as in
`corelens.metrics.headsets`), a layer-matched set (`short_by` says where it holds fewer than k) or the
bottom-k heads, or (set "adaptive") as many heads per layer as the top-k set holds there, chosen per prompt
during its prefill (docs/methods.md#adaptive-hybrid); every other head
streams with `S` sinks and a window of `W` (docs/methods.md#hybrid) in the prefill. Each sample is answered greedily;
`decode` says how: "full" (the default, as in the paper: every head attends to every cached key after the
hybrid prefill) or "stream" (the streaming heads keep their pattern, with the trimmed hybrid cache). The
baseline ("dense") is the unmodified model. `ideal_speedup` pools the (query, key) pairs over the samples:
all causal prefill pairs of the condition's prompts over the pairs its policy keeps. `S` and `W` are token counts or a percentage
of the median prompt length of the data ("25%"), resolved once and recorded, so that a short-prompt task
can be given a window that actually drops keys (a share needs every prompt's length before the first
answer: one length pass; token counts need none, and the median is then read off the answers). Resumable
like every run: each (condition, sample) answer is logged before the next starts. The sweep is the one
policy sweep (`corelens.experiments.policy_sweep`) with `hybrid_preset`: each condition answers under a
registered policy, `HybridAttention` or `AdaptiveHybrid`, through `corelens.policies.answer`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import pandas as pd

from corelens.attention.kernels import DENSE_BELOW, pooled_speedup
from corelens.attention.streaming import DECODES, HybridPlan
from corelens.choices import ADAPTIVE, HYBRID_POLICIES, HYBRID_SET_KINDS
from corelens.errors import CorelensError, OptionError
from corelens.errors import warn as default_warn
from corelens.experiments.policy_sweep import (
    RECORD,
    Plan,
    Preset,
    Tables,
    given_policy,
    parameters,
    records_frame,
    sweep_policies,
)
from corelens.experiments.sweep import condition_table, run_on_path, run_sweep
from corelens.metrics import draws
from corelens.metrics.headsets import SEEDED, STABLE_P, HeadSet, k_count, label, parse_k, select
from corelens.metrics.kvheads import expand, granularity_of, shares
from corelens.metrics.uncertainty import RESAMPLED
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prompt_length
from corelens.policies import AdaptiveHybrid, HybridAttention, Policy
from corelens.runs import file_hash
from corelens.runs.context import RunContext
from corelens.runs.driver import prompt_lengths
from corelens.runs.outputs import HYBRID

DENSE = "dense"
SETS = ("top", "random", "bottom")
SET_KINDS = HYBRID_SET_KINDS  # what `sets` may name
COLUMNS = [
    "set", "keep", "full_heads", "fraction", "seed", "sink", "window", "accuracy", "n", "correct",
    "ci_low", "ci_high", "mean_tokens", "ideal_speedup", "cache_saved_fraction", "short_by",
    "granularity", "asked", "asked_fraction", "kv_full_heads", "kv_fraction", "cache_kept_fraction", "heads",
    "dense_prefills", "prompt_covered",
]  # fmt: skip
MOST = 0.5  # warn when S + W covers the whole prompt of more than this share of the samples


def noop_warning(lengths: Sequence[int], sink: int, window: int, full: Sequence[int] = (), total: int = 0):
    """Return why a hybrid run changes nothing, with settings that would act, or None when it acts.

    S + W covering a prompt lets every streaming head see every key: hybrid attention is then the model's own.
    `full` is each evaluated set's count of heads kept full, `total` the model's heads: a set of all of them
    also changes nothing.

    Examples:
        >>> noop_warning([141, 150, 160], 128, 1024)[:58]
        'S + W = 128 + 1024 tokens cover the whole prompt of 3 of 3'
        >>> noop_warning([141, 150, 160], 4, 16) is None
        True
        >>> noop_warning([141], 4, 16, full=[8, 32], total=32)[:40]
        'a set keeps all 32 heads full: it change'
    """
    said = []
    covered = [n for n in lengths if n <= sink + window]
    if lengths and len(covered) > MOST * len(lengths):
        median = statistics.median(lengths)
        s, w = max(1, round(0.02 * median)), max(1, round(0.10 * median))
        said.append(
            f"S + W = {sink} + {window} tokens cover the whole prompt of {len(covered)} of {len(lengths)} samples "
            f"(median prompt {median:.0f} tokens): there every streaming head sees every key and hybrid "
            f"attention changes nothing; give shares of the prompt (--sink 2% --window 10%) or counts that "
            f"act (--sink {s} --window {w})"
        )
    if total and any(n >= total for n in full):
        said.append(f"a set keeps all {total} heads full: it changes nothing (give --n-heads below {total})")
    return "; ".join(said) or None


@dataclass(frozen=True)
class Condition:
    """One evaluated condition: a hybrid policy, or None for the dense baseline."""

    name: str
    kind: str
    keep: str
    seed: int | None
    policy: HybridPlan | None
    short_by: int = 0  # heads the full set lacks to reach its kept count (a control that ran out of heads)
    adaptive: bool = False  # the policy's per-layer counts, with the heads chosen per prompt
    asked: int | None = None  # rows of the head table asked for (query or KV heads); None: dense

    @property
    def k(self) -> str:
        """Return the kept share as given (the sweep's size)."""
        return self.keep

    @property
    def heads(self) -> tuple[tuple[int, int], ...] | None:
        """Return the full heads (None: the dense baseline)."""
        return None if self.policy is None else self.policy.full


def resolve_size(spec: str | int, lengths: Sequence[int]) -> int:
    """Return a token count from "512" / 512 or a share of the median prompt length ("25%")."""
    text = str(spec).strip()
    if text.endswith("%"):
        if not lengths:
            raise CorelensError(f"{text}: no prompt lengths to take a share of")
        return max(1, round(float(text[:-1]) / 100 * statistics.median(lengths)))
    try:
        return int(text)
    except ValueError:
        raise CorelensError(f"bad size {text!r}: expected a token count (1024) or a share (25%)") from None


def conditions(
    table: pd.DataFrame,
    keeps: Sequence[str],
    sets: Sequence[str],
    seeds: int | Sequence[int],
    seed: int,
    sink: int,
    window: int,
    random_from: str = "all",
    resampled: Sequence[HeadSet] = (),
    stable_p: float = STABLE_P,
    group: int = 1,
    task: str | None = None,
) -> list[Condition]:
    """Return the dense baseline, one hybrid condition per (kept fraction, set, draw), then the `resampled` sets.

    Seeded sets are drawn `seeds` times (draws 0..seeds-1), or once per draw index of a sequence, for `task`.

    A KV-head table (`corelens.metrics.kvheads`) picks KV heads: `keep` counts them, and the policy keeps all
    `group` query heads of each full.
    """
    kv = granularity_of(table) == "kv"
    out = [Condition(DENSE, DENSE, "100%", None, None)]
    which = range(seeds) if isinstance(seeds, int) else list(seeds)
    for keep in keeps:
        for kind in sets:
            for draw in which if kind in SEEDED else [None]:
                # Seeded by (base seed, task, kind, count, draw), as in the ablation sweep.
                count = k_count(keep, len(table))
                # The adaptive set keeps the top-k set's count in each layer; its heads are chosen per prompt.
                chosen = "top" if kind == ADAPTIVE else kind
                heads = select(
                    table, chosen, count, draw, base_seed=seed, random_from=random_from, p=stable_p, task=task
                )
                source = {"keep": keep, "kind": kind, "seed": draw, "base_seed": seed}
                if task is not None and kind in SEEDED:
                    source["task"] = task
                if kind == "random":
                    source["random_from"] = random_from
                if kv:
                    source["granularity"] = "kv"
                full = expand(heads, group) if kv else heads
                policy = HybridPlan(full, sink, window, source)
                name = f"{kind}/{keep}" + (f"/s{draw}" if draw is not None else "")
                short = count - len(heads)
                out.append(Condition(name, kind, keep, draw, policy, short, kind == ADAPTIVE, count))
    return out + [resampled_condition(hs, seed, sink, window) for hs in resampled]


def resampled_condition(hs: HeadSet, seed: int, sink: int, window: int) -> Condition:
    """Return the condition keeping a resampled ranking's top-k set `hs` full."""
    source = {"keep": hs.k, "kind": RESAMPLED, "resample": hs.seed, "base_seed": seed}
    policy = HybridPlan(hs.heads, sink, window, source)
    return Condition(hs.name, RESAMPLED, hs.k, hs.seed, policy, asked=hs.count)


def _table(
    records: pd.DataFrame,
    conds: Sequence[Condition],
    shape: tuple[int, int, int],
    sink: int,
    window: int,
    granularity: str = "query",
) -> pd.DataFrame:
    """Return hybrid.csv: per condition its accuracy, the asked share and the effective ones.

    `shape` is (layers, query heads, KV heads). Asked: `keep` as given, `asked` rows of the head table (query
    or KV heads, `granularity`) and their share. Effective: `full_heads` / `fraction` (query heads full),
    `kv_full_heads` / `kv_fraction` (KV heads with a full query head: never trimmed) and
    `cache_kept_fraction` (KV-cache bytes a trimmed cache keeps, averaged over the prompts; analytic,
    whatever `decode` is; `cache_saved_fraction` is what this run's decoding saved).
    """
    layers, heads, kv_heads = shape
    total_heads = layers * heads
    units = total_heads if granularity == "query" else layers * kv_heads

    def row(c: Condition, got: pd.DataFrame, scores: dict) -> dict:
        n = scores["n"]
        full = total_heads if c.policy is None else len(c.policy.full)
        tokens = float(got["tokens"].mean()) if n else float("nan")
        full_set = (
            [(i, h) for i in range(layers) for h in range(heads)] if c.policy is None else c.policy.full
        )
        lengths = [int(t) for t in got["tokens"]] or None
        eff = shares(full_set, layers, heads, kv_heads, sink=sink, window=window, tokens=lengths)
        asked = units if c.asked is None else c.asked
        return {
            "set": c.kind,
            "keep": c.keep,
            "full_heads": full,
            "fraction": full / total_heads,
            "seed": c.seed,
            "sink": sink,
            "window": window,
            **scores,
            "mean_tokens": tokens,
            "ideal_speedup": pooled_speedup(got["tokens"], full / total_heads, sink, window),
            "cache_saved_fraction": float(got["saved"].mean()) if n else float("nan"),
            "short_by": c.short_by,
            "granularity": granularity,
            "asked": asked,
            "asked_fraction": asked / units,
            "kv_full_heads": eff["kv_full"],
            "kv_fraction": eff["kv_fraction"],
            "cache_kept_fraction": eff["cache_kept_fraction"],
            "heads": "all" if c.policy is None else label(c.policy.full),
            "dense_prefills": float(got["dense_prefills"].mean()) if n else 0.0,
            "prompt_covered": float((got["tokens"] <= sink + window).mean()) if n else float("nan"),
        }

    return condition_table(records, conds, row, COLUMNS)


@dataclass
class HybridCurve:
    """The result: accuracy per condition (`table`), per-sample `records`, and the resolved sink / window."""

    table: pd.DataFrame
    records: pd.DataFrame
    sink: int
    window: int
    median_tokens: float
    resampled: pd.DataFrame | None = None
    summary: pd.DataFrame | None = None  # per (set, keep): mean over draws, two-level interval, draws
    warning: str | None = None  # why the run changes nothing (S + W covers most prompts, ...), or None


# The fields of hybrid attention the sweep fills: each condition's full set, S and W (--sink / --window, which
# may be shares of the median prompt) and where the set came from; the rest are the policy's parameters.
FILLED = ("full", "sink", "window", "source")


def hybrid_template(
    policy: Policy | dict | str | None = None,
    decode: str = "full",
    kernel: str = "auto",
    dense_below: float | None = DENSE_BELOW,
) -> HybridAttention:
    """Return the policy every full set of a hybrid sweep gets, its full set still empty: `policy` (hybrid
    attention or a registered policy derived from it: a policy, its `to_dict` data or JSON text, parameters
    included) or else hybrid attention with `decode`, `kernel` and `dense_below`.

    Examples:
        >>> hybrid_template('{"name": "hybrid", "decode": "stream"}') == hybrid_template(decode="stream")
        True
        >>> hybrid_template('{"name": "hybrid", "window": 64}')
        Traceback (most recent call last):
        ...
        corelens.errors.OptionError: --policy: S and W are the sweep's --sink / --window (a count or a share of the median prompt); leave 'sink' and 'window' out of the policy
    """
    plain = HybridAttention(decode=decode, kernel=kernel, dense_below=dense_below)
    if policy is None:
        return plain
    if plain != HybridAttention():
        raise OptionError(
            "give hybrid attention's settings as --policy or as --decode / --kernel / --dense-below, not both"
        )
    policy = given_policy(policy, HybridAttention, HYBRID_POLICIES)
    if policy.full:
        raise OptionError(
            f"--policy: {policy.name!r} is given full heads; a sweep fills them from each head set"
        )
    if (policy.sink, policy.window) != (HybridAttention.sink, HybridAttention.window):
        raise OptionError("--policy: S and W are the sweep's --sink / --window (a count or a share of the median "
                          "prompt); leave 'sink' and 'window' out of the policy")  # fmt: skip
    return policy


def is_share(spec: str | int) -> bool:
    """Return True when a size is a share of the median prompt ("25%") rather than a token count."""
    return str(spec).strip().endswith("%")


def check_sets(decode: str, sets: Sequence[str]) -> None:
    """Refuse a decode mode or head sets the hybrid sweep cannot run, before anything is read."""
    if decode not in DECODES:
        raise CorelensError(f"unknown decode mode {decode!r}; expected one of {DECODES}")
    unknown = set(sets) - set(SET_KINDS)
    if unknown:
        raise CorelensError(f"unknown head set(s) {sorted(unknown)}")
    if ADAPTIVE in sets and decode != "full":
        raise CorelensError("the adaptive set decodes with full attention: use --decode full")


def check_granularity(plan: Plan) -> None:
    """Refuse the adaptive set on KV heads."""
    if ADAPTIVE in plan.sets and plan.unit == "kv":
        raise OptionError("the adaptive set chooses query heads per prompt: use --granularity query with it")


def hybrid_settings(sink: str | int, window: str | int, template: HybridAttention, plan: Plan) -> dict:
    """Return the hybrid sweep's own manifest settings (the kernel and a derived policy only when not the
    defaults, so that runs without them resume as before)."""
    out = {
        "heads": str(Path(plan.heads).resolve()),
        "heads_sha256": file_hash(plan.heads),
        "identified_on": plan.identified.get("data"),
        "keeps": plan.ks,
        "seeds": plan.seeds,
        "sink": str(sink),
        "window": str(window),
        "decode": template.decode,
    }
    if template.kernel != "auto" or template.dense_below != DENSE_BELOW:
        out.update(kernel=template.kernel, dense_below=template.dense_below)
    # A policy with parameters the options above do not say (a policy derived from hybrid attention).
    plain = HybridAttention(decode=template.decode, kernel=template.kernel, dense_below=template.dense_below)
    if parameters(template, FILLED) != parameters(plain, FILLED):
        out["policy"] = parameters(template, FILLED)
    return out


def resolve_sizes(sink: str | int, window: str | int, plan: Plan, run) -> dict:
    """Return S and W in tokens (`sink`, `window`); a share of the median prompt needs every prompt's length
    before the loop (`lengths`, measured once over all ranks, cached in the run) and gives the `median`;
    token counts do not (the median then comes from the records). Recorded in the run's manifest."""
    state: dict = {"lengths": None, "median": math.nan}
    lengths = []
    if is_share(sink) or is_share(window):
        state["lengths"] = prompt_lengths(plan.samples, partial(prompt_length, plan.m), run)
        lengths = [n for n in state["lengths"].values() if n is not None]
        state["median"] = float(statistics.median(lengths)) if lengths else math.nan
    state.update(sink=resolve_size(sink, lengths), window=resolve_size(window, lengths))
    if run is not None and run.dist.main:
        run.manifest.update(sink_tokens=state["sink"], window_tokens=state["window"])
        if state["lengths"] is not None:
            run.manifest["median_prompt_tokens"] = state["median"]
        run.manifest["granularity"] = {"granularity": plan.unit, "query_heads_per_kv_head": plan.group}
        run.manifest["task"] = plan.task
    return state


def hybrid_conditions(plan: Plan, ks, kinds, which, resampled=()) -> list[Condition]:
    """Return `conditions` of the plan's head table, with S and W as resolved (`resolve_sizes`)."""
    sink, window = plan.state["sink"], plan.state["window"]
    return conditions(
        plan.table, ks, kinds, which, plan.seed, sink, window, plan.random_from, resampled, plan.stable_p,
        plan.group, task=plan.task,
    )  # fmt: skip


def hybrid_policy(template: HybridAttention, plan: Plan, c: Condition) -> Policy | None:
    """Return the registered policy of `c`: `template` on its full set, or (set adaptive) as many full heads
    per layer, chosen per prompt during the prefill; None for the dense baseline."""
    if c.policy is None:
        return None
    if c.adaptive:
        budget = c.policy.fraction(plan.m.num_layers, plan.m.num_heads)
        return AdaptiveHybrid(budget, c.policy.full, c.policy.sink, c.policy.window, kernel=template.kernel)
    p = c.policy
    return replace(template, full=p.full, sink=p.sink, window=p.window, source=p.source)


def hybrid_entry(template: HybridAttention, plan: Plan, c: Condition) -> dict:
    """Return `c` as policies.json lists it: the registered policy's JSON (`Policy.from_dict` reads it)."""
    policy = hybrid_policy(template, plan, c)
    return {"name": c.name, **({"policy": policy.to_dict()} if policy else {}), "adaptive": c.adaptive}


def measured(prepared: Prepared, stats: dict) -> dict:
    """Return a record's hybrid fields: the prompt's tokens and what the policy measured while answering.
    The baseline answers unmodified: nothing saved, no hybrid prefill. A kernel fallback (`kernels.prefill`:
    the fast path failed) is recorded with the answer it produced."""
    return {
        "tokens": prepared.seq_len,
        "saved": stats.get("saved", 0.0),
        "prefill": dict(stats.get("prefill", {})),
        "crossover": stats.get("crossover", "ideal"),
        "fallbacks": list(stats.get("fallbacks", [])),
    }


def hybrid_tables(template: HybridAttention, plan: Plan, ok: list[dict], conds) -> Tables:
    """Return the records, hybrid.csv and the manifest's entries: the prefill totals, the median prompt and
    why the run changes nothing (`noop_warning`, None when it acts)."""
    records = records_frame(ok, [*RECORD[:3], "tokens", *RECORD[3:], "saved"])
    # The share of a record's layer prefills that the partitioned kernel's crossover ran dense (records
    # logged before this field existed count as none).
    records["dense_prefills"] = [_dense_share(r.get("prefill") or {}) for r in ok]
    median = plan.state["median"]
    if plan.state["lengths"] is None:  # S and W in tokens: the median prompt is read off the answers
        tokens = dict(zip(records["sample"], records["tokens"]))
        median = float(statistics.median(tokens.values())) if tokens else math.nan
    m, sink, window = plan.m, plan.state["sink"], plan.state["window"]
    shape = (m.num_layers, m.num_heads, m.num_kv_heads)
    table = _table(records, conds, shape, sink, window, plan.unit)
    lengths = [int(n) for n in records.drop_duplicates("sample")["tokens"]] if len(records) else []
    full = [int(n) for n in table.loc[table["set"] != DENSE, "full_heads"]]
    warning = noop_warning(lengths, sink, window, full, m.num_layers * m.num_heads)
    totals = sum((Counter(r.get("prefill") or {}) for r in ok), Counter())
    prefill = {"kernel": template.kernel, "dense_below": template.dense_below, "layer_prefills": dict(totals)}
    # Which crossover ran dense (a measured table's path, or "ideal") and every kernel fallback's reason.
    prefill["crossover"] = sorted({str(r.get("crossover", "ideal")) for r in ok}) or ["ideal"]
    prefill["fallbacks"] = sorted({reason for r in ok for reason in r.get("fallbacks") or []})
    return Tables(records, table, {"prefill": prefill, "median_prompt_tokens": median, "no_effect": warning})


def kept_figure(plan: Plan, tables: Tables, paths: dict[str, Path]) -> None:
    """Draw accuracy against the heads kept full."""
    from corelens.report.curves import accuracy_vs_kept

    median = tables.manifest["median_prompt_tokens"]
    sizes = f"S={plan.state['sink']}, W={plan.state['window']}, median prompt {median:.0f}"
    accuracy_vs_kept(
        tables.table, paths["hybrid"], title=f"hybrid attention on {Path(plan.data).name} ({sizes})"
    )


def hybrid_preset(
    sink: str | int = 128, window: str | int = 1024, template: HybridAttention | None = None
) -> Preset:
    """Return `corelens hybrid` as a policy sweep: each full set kept causal under `template`
    (`hybrid_template`), every other head streaming with S = `sink` and W = `window` (counts or shares).

    Examples:
        >>> preset = hybrid_preset(4, "10%")
        >>> preset.command, preset.key, preset.size, preset.before
        ('hybrid', 'keep', 'full_heads', ('tokens',))
    """
    template = HybridAttention() if template is None else template
    return Preset(
        "hybrid",
        HYBRID,
        "keep",
        "full_heads",
        template,
        FILLED,
        conditions=hybrid_conditions,
        entry=partial(hybrid_entry, template),
        tables=partial(hybrid_tables, template),
        figure=kept_figure,
        settings=partial(hybrid_settings, sink, window, template),
        check=check_granularity,
        prepare=partial(resolve_sizes, sink, window),
        policy=partial(hybrid_policy, template),
        record=measured,
        before=("tokens",),
    )


def curve(
    m: Loaded,
    data: str | Path,
    heads: str | Path,
    *,
    keeps: str | Sequence[str] = ("5%", "10%", "20%", "50%"),
    sets: Sequence[str] = SETS,
    seeds: int | str = draws.AUTO,
    seed: int = 0,
    random_from: str = "all",
    control_width: float = draws.WIDTH,
    max_draws: int = draws.MAX_DRAWS,
    sink: str | int = 128,
    window: str | int = 1024,
    decode: str = "full",
    scorer: str = "auto",
    max_new_tokens: int = 8,
    warn: Callable[[str], None] = default_warn,
    rank_resamples: int = 0,
    resample: bool = True,
    stable_p: float = STABLE_P,
    granularity: str | None = None,
    kernel: str = "auto",
    dense_below: float | None = DENSE_BELOW,
    policy: Policy | dict | str | None = None,
    ctx: RunContext | None = None,
    **context,
) -> HybridCurve:
    """Evaluate `data` under hybrid attention with top / random / bottom full sets of `heads` at each kept share.

    `rank_resamples` R > 0 adds the top-k full set of R bootstrap resamples of the rank run's samples
    ("top-resampled"; `resampled.csv`: median and 90 % interval), as in `corelens.experiments.ablate.sweep`.
    `granularity` "kv" picks KV heads (a KV table of `rank --granularity kv`, or a query table's members
    summed) and keeps all their query heads full; None: the table's own (docs/methods.md#kv-heads).
    `kernel` / `dense_below`: the prefill kernel and the partitioned kernel's crossover; `hybrid.csv`'s
    `dense_prefills` is the share of layer prefills the crossover ran dense, the manifest's `prefill` the totals.
    `seeds`, `control_width`, `max_draws`: the draws of random / layer-matched sets, seeded for the data's task
    (`task_of`), as in `corelens.experiments.ablate.sweep`; `hybrid_summary.csv` holds each set's mean over
    draws with the two-level interval.
    `ctx` is the run (`RunContext`: `out`, `skip_bad`, `limit`, `limits`, `progress`, `argv`), whose fields
    may also be given as keywords.
    The sweep is `corelens.experiments.policy_sweep`'s, with `hybrid_preset`; each sample is prepared once, and
    once more before the loop only when S or W is a share of the median prompt.
    `policy` (`hybrid_template`): hybrid attention or a registered policy derived from it, with its parameters,
    in place of `decode` / `kernel` / `dense_below`; each full set fills it.
    """
    template = hybrid_template(policy, decode, kernel, dense_below)
    check_sets(template.decode, sets)
    swept = sweep_policies(
        hybrid_preset(sink, window, template), m, data, heads, ks=parse_k(keeps), granularity=granularity,
        warn=warn, sets=list(sets), seeds=seeds, seed=seed, random_from=random_from, stable_p=stable_p,
        control_width=control_width, max_draws=max_draws, rank_resamples=rank_resamples, resample=resample,
        scorer=scorer, max_new_tokens=max_new_tokens, ctx=RunContext.of(ctx, **context),
    )  # fmt: skip
    warning, state = swept.manifest["no_effect"], swept.state
    if warning:
        warn(warning)
    return HybridCurve(
        swept.table, swept.records, state["sink"], state["window"], swept.manifest["median_prompt_tokens"],
        swept.resampled, swept.summary, warning,
    )  # fmt: skip


def _dense_share(prefill: dict) -> float:
    total = sum(prefill.values())
    return prefill.get("dense", 0) / total if total else 0.0


# Load a model from its path (or hub id) and run the hybrid accuracy curve into a run directory; `corelens hybrid`.
curve_path = partial(run_on_path, curve)


def run_command(config, ctx, load_options: dict):
    """`corelens hybrid`: the policy checked (its fields, --policy beside --decode...) before the model loads."""
    hybrid_template(config.policy, config.decode, config.kernel, config.dense_below)
    return run_sweep(curve, config, ctx, load_options)
