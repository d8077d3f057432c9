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
can be given a window that actually drops keys. Resumable like every run: each (condition, sample) answer
is logged before the next starts.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pandas as pd

from corelens.attention.kernels import DENSE_BELOW, pooled_speedup
from corelens.attention.streaming import DECODES, HybridPolicy
from corelens.choices import ADAPTIVE, HYBRID_SET_KINDS
from corelens.data.sample import Sample, task_of
from corelens.errors import CorelensError, InputError, OptionError
from corelens.errors import warn as default_warn
from corelens.experiments.ablate import rank_manifest, read_heads, resampled_sets, same_file_warning
from corelens.experiments.evaluate import interval, score
from corelens.experiments.sweep import Tail, conclude_sweep, run_sweep
from corelens.metrics import draws
from corelens.metrics.headsets import SEEDED, STABLE_P, HeadSet, k_count, label, parse_k, select
from corelens.metrics.kvheads import expand, granularity_of, group_size, shares
from corelens.metrics.uncertainty import RESAMPLED
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.policies import AdaptiveHybrid, HybridAttention, answer
from corelens.runs import file_hash, model_data_settings, write_json
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop, ordered, prompt_lengths
from corelens.runs.outputs import HYBRID

DENSE = "dense"
SETS = ("top", "random", "bottom")
SET_KINDS = HYBRID_SET_KINDS  # what `sets` may name
COLUMNS = [
    "set", "keep", "full_heads", "fraction", "seed", "sink", "window", "accuracy", "n", "correct",
    "ci_low", "ci_high", "mean_tokens", "ideal_speedup", "cache_saved_fraction", "short_by",
    "granularity", "asked", "asked_fraction", "kv_full_heads", "kv_fraction", "cache_kept_fraction", "heads",
    "dense_prefills",
]  # fmt: skip


@dataclass(frozen=True)
class Condition:
    """One evaluated condition: a hybrid policy, or None for the dense baseline."""

    name: str
    kind: str
    keep: str
    seed: int | None
    policy: HybridPolicy | None
    short_by: int = 0  # heads the full set lacks to reach its kept count (a control that ran out of heads)
    adaptive: bool = False  # the policy's per-layer counts, with the heads chosen per prompt
    asked: int | None = None  # rows of the head table asked for (query or KV heads); None: dense


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
                policy = HybridPolicy(full, sink, window, source)
                name = f"{kind}/{keep}" + (f"/s{draw}" if draw is not None else "")
                short = count - len(heads)
                out.append(Condition(name, kind, keep, draw, policy, short, kind == ADAPTIVE, count))
    for hs in resampled:
        source = {"keep": hs.k, "kind": RESAMPLED, "resample": hs.seed, "base_seed": seed}
        policy = HybridPolicy(hs.heads, sink, window, source)
        out.append(Condition(hs.name, RESAMPLED, hs.k, hs.seed, policy, asked=hs.count))
    return out


def generate_answer(
    m: Loaded,
    prepared: Prepared,
    max_new_tokens: int,
    policy: HybridPolicy | None,
    decode: str = "full",
    adaptive: bool = False,
    *,
    kernel: str = "auto",
    dense_below: float | None = DENSE_BELOW,
    ran: Counter | None = None,
) -> tuple[str, float]:
    """Return the greedy answer (new tokens, special tokens dropped) and the share of cache bytes saved.

    `adaptive`: keep `policy`'s number of full heads in each layer, chosen per prompt during the prefill.
    `kernel` / `dense_below`: the prefill kernel and the partitioned kernel's crossover (`corelens.hybrid`);
    `ran` counts the layer prefills per kernel that ran ("dense": the crossover ran every head causal).
    """
    if policy is None:
        return answer(m, prepared, None, max_new_tokens=max_new_tokens), 0.0
    if adaptive:
        budget = policy.fraction(m.num_layers, m.num_heads)
        applied = AdaptiveHybrid(budget, policy.full, policy.sink, policy.window, kernel=kernel)
    else:
        applied = HybridAttention.of(policy, decode=decode, kernel=kernel, dense_below=dense_below)
    stats: dict = {}
    text = answer(m, prepared, applied, max_new_tokens=max_new_tokens, stats=stats)
    if ran is not None:
        ran.update(stats["prefill"])
    return text, stats["saved"]


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
    rows = []
    for c in conds:
        got = records[records["condition"] == c.name]
        n, correct = len(got), int(got["correct"].sum()) if len(got) else 0
        low, high = interval(correct, n)
        full = total_heads if c.policy is None else len(c.policy.full)
        tokens = float(got["tokens"].mean()) if n else float("nan")
        full_set = (
            [(i, h) for i in range(layers) for h in range(heads)] if c.policy is None else c.policy.full
        )
        lengths = [int(t) for t in got["tokens"]] or None
        eff = shares(full_set, layers, heads, kv_heads, sink=sink, window=window, tokens=lengths)
        asked = units if c.asked is None else c.asked
        rows.append(
            {
                "set": c.kind,
                "keep": c.keep,
                "full_heads": full,
                "fraction": full / total_heads,
                "seed": c.seed,
                "sink": sink,
                "window": window,
                "accuracy": correct / n if n else float("nan"),
                "n": n,
                "correct": correct,
                "ci_low": low,
                "ci_high": high,
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
            }
        )
    table = pd.DataFrame(rows, columns=COLUMNS)
    table["seed"] = table["seed"].astype("Int64")
    return table


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
    """
    ctx = RunContext.of(ctx, **context)
    keeps = parse_k(keeps)
    if decode not in DECODES:
        raise CorelensError(f"unknown decode mode {decode!r}; expected one of {DECODES}")
    unknown = set(sets) - set(SET_KINDS)
    if unknown:
        raise CorelensError(f"unknown head set(s) {sorted(unknown)}")
    if ADAPTIVE in sets and decode != "full":
        raise CorelensError("the adaptive set decodes with full attention: use --decode full")
    draws.check(seeds, control_width, max_draws)
    auto = seeds == draws.AUTO
    table = read_heads(heads, m, granularity)
    unit = granularity_of(table)
    if ADAPTIVE in sets and unit == "kv":
        raise OptionError("the adaptive set chooses query heads per prompt: use --granularity query with it")
    group = group_size(m.num_heads, m.num_kv_heads)
    identified = rank_manifest(heads)
    warning = same_file_warning(data, identified)
    if warning:
        warn(warning)
    samples, skipped = ctx.read(data)
    missing = [s.id for s in samples if s.answer is None]
    if missing:
        raise InputError(
            f"{len(missing)} sample(s) have no answer to score against", file=str(data), sample=missing[0]
        )
    task = task_of(samples, data)
    drawn_kinds = [s for s in sets if s in SEEDED]

    run = None
    if ctx.out is not None:
        settings = {
            **model_data_settings(m, data),
            "heads": str(Path(heads).resolve()),
            "heads_sha256": file_hash(heads),
            "identified_on": identified.get("data"),
            "keeps": keeps,
            "sets": list(sets),
            "seeds": seeds,
            "seed": seed,
            "task": task,
            "random_from": random_from,
            "sink": str(sink),
            "window": str(window),
            "decode": decode,
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
        if kernel != "auto" or dense_below != DENSE_BELOW:
            settings.update(kernel=kernel, dense_below=dense_below)
        if auto and drawn_kinds:
            settings.update(control_width=control_width, max_draws=max_draws)
        run = ctx.open("hybrid", settings, device=m.device)
    # S and W may be shares of the median prompt: measure every prompt once (over all ranks, cached in the run).
    measured = prompt_lengths(samples, partial(prompt_length, m), run)
    lengths = [n for n in measured.values() if n is not None]
    median = float(statistics.median(lengths)) if lengths else float("nan")
    sink_n, window_n = resolve_size(sink, lengths), resolve_size(window, lengths)
    by_kv = group if unit == "kv" else None
    drawn = (
        resampled_sets(heads, keeps, rank_resamples, seed, resample=resample, group=by_kv)
        if rank_resamples
        else []
    )
    first = draws.first_draws(seeds, max_draws)
    conds = conditions(
        table, keeps, sets, first, seed, sink_n, window_n, random_from, drawn, stable_p, group, task=task
    )
    shape = (m.num_layers, m.num_heads, m.num_kv_heads)

    def record_policies() -> None:
        if run is None or not run.dist.main:
            return
        run.manifest.update(sink_tokens=sink_n, window_tokens=window_n, median_prompt_tokens=median)
        run.manifest["granularity"] = {"granularity": unit, "query_heads_per_kv_head": group}
        if warning:
            run.manifest["warnings"] = sorted(set(run.manifest.get("warnings", [])) | {warning})
        run.manifest["task"] = task
        write_json(
            HYBRID.path(run.path, "sets"),
            [
                {"name": c.name, **(c.policy.to_dict() if c.policy else {}), "adaptive": c.adaptive}
                for c in conds
            ],
            root=run.path,
        )

    record_policies()

    def step(sample: Sample, done: set[str], p: Prepared) -> Iterator[dict]:
        answers: dict[tuple | None, tuple[str, float, Counter]] = {}  # equal full sets share one generation
        for c in conds:
            if f"{c.name}|{sample.id}" in done or f"{c.name}|{sample.id}" in have:
                continue
            full = None if c.policy is None else (c.adaptive, c.policy.full)
            if full not in answers:
                ran = Counter()
                got = generate_answer(
                    m,
                    p,
                    max_new_tokens,
                    c.policy,
                    decode,
                    c.adaptive,
                    kernel=kernel,
                    dense_below=dense_below,
                    ran=ran,
                )
                answers[full] = (*got, ran)
            prediction, saved, ran = answers[full]
            yield {
                "id": f"{c.name}|{sample.id}",
                "status": "ok",
                "condition": c.name,
                "sample": sample.id,
                "task": sample.task,
                "tokens": p.seq_len,
                "prediction": prediction,
                "gold": sample.answer,
                "correct": score(prediction, sample.answer, sample.choices, scorer),
                "saved": saved,
                "prefill": dict(ran),  # layer prefills per kernel that ran
            }

    loop = Loop(
        "hybrid",
        step,
        keys=lambda s: [f"{c.name}|{s.id}" for c in conds],
        skip_key=lambda s: f"skipped|{s.id}",
        length=lambda s: measured[s.id] or 0,
        prepare=partial(prepare, m),
    )
    have: dict[str, dict] = {}  # records of earlier rounds (a run without --out keeps them only here)
    columns = ["condition", "sample", "task", "tokens", "prediction", "gold", "correct", "saved"]

    def evaluate() -> tuple[list[dict], list[dict], pd.DataFrame, pd.DataFrame]:
        got = ctx.drive(loop, samples, run, skipped)
        have.update((r["id"], r) for r in got)
        logged = ordered(loop, samples, have.values())
        ok = [r for r in logged if r.get("status") == "ok"]
        records = pd.DataFrame([{k: r[k] for k in columns} for r in ok], columns=columns)
        # The share of a record's layer prefills that the partitioned kernel's crossover ran dense (records
        # logged before this field existed count as none).
        records["dense_prefills"] = [_dense_share(r.get("prefill") or {}) for r in ok]
        return logged, ok, records, _table(records, conds, shape, sink_n, window_n, unit)

    logged, ok, records, result = evaluate()
    # --seeds auto: a batch more draws for each control still wider than the target (see ablate.sweep).
    found = draws.controls(result, "keep", control_width, max_draws, auto)
    while any(c.stopped == "more" for c in found):
        added = 0
        for c in found:
            batch = conditions(
                table, [c.k], [c.kind], draws.more(c, max_draws), seed, sink_n, window_n, random_from,
                (), stable_p, group, task=task,
            )  # fmt: skip
            conds.extend(batch[1:])  # less the dense baseline each call starts with
            added += len(batch) - 1
        if not added:
            break  # nothing left to draw (cannot happen while `more` and `status` agree on the cap)
        record_policies()
        logged, ok, records, result = evaluate()
        found = draws.controls(result, "keep", control_width, max_draws, auto)
    names = {(c.kind, c.keep, c.seed): c.name for c in conds}
    tail = Tail(
        HYBRID,
        result,
        records,
        names,
        found,
        task,
        seed,
        "keep",
        "full_heads",
        control_width,
        max_draws,
        auto,
    )
    over = [(c.keep, c.policy.full) for c in conds if c.kind == RESAMPLED] if rank_resamples else None
    totals = sum((Counter(r.get("prefill") or {}) for r in ok), Counter())
    prefill = {"kernel": kernel, "dense_below": dense_below, "layer_prefills": dict(totals)}

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.curves import accuracy_vs_kept

        accuracy_vs_kept(
            result,
            paths["hybrid"],
            title=f"hybrid attention on {Path(data).name} (S={sink_n}, W={window_n}, median prompt {median:.0f})",
        )

    skips = sum(1 for r in logged if r.get("status") == "skipped")
    finish = {"samples": len(samples), "conditions": len(conds), "skipped": skips}
    summary, resampled = conclude_sweep(run, tail, over, draw=draw, manifest={"prefill": prefill}, **finish)
    return HybridCurve(result, records, sink_n, window_n, median, resampled, summary)


def _dense_share(prefill: dict) -> float:
    total = sum(prefill.values())
    return prefill.get("dense", 0) / total if total else 0.0


def curve_path(
    model: str | Path,
    data: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    load_options: dict | None = None,
    **kwargs,
) -> HybridCurve:
    """Load `model` (with `load()`'s `load_options`) and run the hybrid accuracy curve into run directory `out`."""
    return curve(load(model, **(load_options or {})), data, heads, out=out, **kwargs)


def run_command(config, ctx: RunContext, load_options: dict) -> HybridCurve:
    """`corelens hybrid`: the generic sweep command (`experiments.sweep.run_sweep`) running `curve`."""
    return run_sweep(curve, config, ctx, load_options)
