"""The head-set sweeps, `corelens ablate` and `corelens hybrid`: their configs and their one tail.

Both sweep head sets drawn from a ranking (top-k, controls drawn until their mean is known, resamples of the
ranking) and score the answers under each; they differ in what is applied to a set (an ablation operator,
or hybrid attention's sink and window). The options they share are declared once here, and so is what
follows the answers: the per-(set, k) summary with its two-level interval, the summary over ranking
resamples, the tables and figure written through the declared outputs, and the controls' report.
Like `corelens.experiments.configs` this module imports no torch at import time: the commands generate their
parsers from these classes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corelens.choices import (
    DENSE_BELOW,
    GRADED_SELECTS,
    HYBRID_POLICIES,
    HYBRID_SET_KINDS,
    KERNELS,
    KEY_SETS,
    OPS,
    OPTIONAL,
    RANDOM_FROM,
    SETS,
    STABLE_P,
)
from corelens.errors import CorelensError
from corelens.experiments.configs import (
    data_option,
    max_new_tokens_option,
    model_option,
    option,
    out_option,
    scorer_option,
)
from corelens.metrics import draws
from corelens.runs.fields import run_options

# Below this many draws a control's interval is at least each draw's own (Wilson) interval: the two-level
# bootstrap over 2 draws that agree has width 0, narrower than one set's interval.
FEW_DRAWS = 3

# The options the head-set sweeps (ablate, hybrid) share, each declared once; `verb` / `what` fill their help.

EVAL_DATA = "samples to evaluate on (JSONL, with answers)"


def heads_option() -> object:
    """--heads: the ranking whose sets are swept."""
    return option(
        help="heads.csv of a rank run, an exported head-set folder or its hub id (found on other data)",
        setting=False,
    )


def stable_p_option() -> object:
    """--stable-p: the stable set's P(top-k) threshold."""
    return option(STABLE_P, help="P(top-k) threshold of the stable set", type=float)


def resamples_option(verb: str) -> object:
    """--rank-resamples: also sweep the top-k of R bootstrap resamples of the ranking."""
    return option(
        0,
        help=f"also {verb} the top-k of R bootstrap resamples of the ranking (needs the run's ram.parquet)",
        type="count_or_zero",
    )


def granularity_option(verb: str) -> object:
    """--granularity: the unit that --k / --keep count."""
    return option(
        None,
        help=f"unit of the heads {verb}: query heads, or KV heads (all their query heads; a query heads.csv "
        "is then scored per KV head by its members' summed mass); default: the heads.csv's own "
        "(docs/methods.md#kv-heads)",
        choices=("query", "kv"),
    )


def draw_options(what: str) -> tuple[object, object, object]:
    """--draws (alias --seeds), --control-width and --max-draws (docs/methods.md#control-head-sets)."""
    seeds = option(
        draws.AUTO,
        help=f"how many sets of {what} to draw: a count, or auto (batches until the mean over draws is known "
        "to --control-width)",
        flag="--draws",
        aliases=("--seeds",),
        metavar="D",
        type=("checked", draws.seeds_arg, "seeds"),
    )
    width = option(
        draws.WIDTH,
        help="--draws auto: width of the 95 %% interval of the control's mean accuracy over draws to reach",
        type=("checked", draws.width_arg, "width"),
    )
    most = option(
        draws.MAX_DRAWS,
        help="--draws auto: the most draws of one control (it stops there and says so)",
        type="count",
    )
    return seeds, width, most


def random_from_option() -> object:
    """--random-from: the pool of the random control."""
    return option(
        "all",
        help="pool of the random-k control: all heads (docs/methods.md#interventions) or the heads outside the top-k set",
        choices=RANDOM_FROM,
    )


def _names(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


_SEEDS, _WIDTH, _MOST = draw_options("each random / layer-matched set")


@dataclass(frozen=True)
class SweepConfig:
    """The options a head-set sweep's help lists first: the model, the samples, the ranking and the run."""

    model: str = model_option()
    data: str = data_option(EVAL_DATA)
    heads: str = heads_option()
    out: str = out_option()


@dataclass(frozen=True)
class AblateConfig(SweepConfig):
    """The settings of `corelens ablate` (docs/usage.md#causal-ablation)."""

    k: str = option(
        "1%,2%,5%,10%",
        help="how many heads each set holds: counts or shares of all heads, e.g. 1%%,5%% or 4,8",
        flag="--n-heads",
        aliases=("--k",),
        type="k_list",
    )
    sets: str = option(
        ",".join(SETS),
        help=f"comma-separated, of {', '.join(SETS + OPTIONAL)} (stable: heads with P(top-k) >= --stable-p)",
        type=("names_of", SETS + OPTIONAL, "head set"),
    )
    stable_p: float = stable_p_option()
    rank_resamples: int = resamples_option("ablate")
    granularity: str | None = granularity_option("ablated")
    op: str = option(
        "zero",
        help="operator, a registered head policy (docs/methods.md#interventions): --policy NAME",
        choices=OPS,
    )
    keys: str = option("visual", help="knockout key set", choices=KEY_SETS)
    policy: str | None = option(
        None,
        help="the policy each set gets, with its parameters, instead of --op / --keys: a name, JSON such as "
        '\'{"name": "knockout", "keys": "omega"}\' or a .json file (docs/usage.md#causal-ablation)',
        type=("policy_of", OPS, "ablation policy"),
        metavar="NAME|JSON",
    )
    seeds: object = _SEEDS
    control_width: float = _WIDTH
    max_draws: int = _MOST
    seed: int = option(0, help="base seed of the random draws", type=int)
    random_from: str = random_from_option()
    reference: str | None = option(
        None, help="op mean: reference samples (default: the rank run's data)", type="samples_path"
    )
    scorer: str = scorer_option()
    max_new_tokens: int = max_new_tokens_option()
    run: None = run_options()

    def kwargs(self) -> dict:
        """The keyword arguments of `experiments.ablate.sweep` these settings make."""
        names = ("op", "keys", "policy", "seeds", "control_width", "max_draws", "seed", "random_from")
        names += ("reference",)
        names += ("scorer", "max_new_tokens", "rank_resamples", "stable_p", "granularity")
        return {"ks": self.k, "sets": _names(self.sets), **{n: getattr(self, n) for n in names}}


@dataclass(frozen=True)
class HybridConfig(SweepConfig):
    """The settings of `corelens hybrid` (docs/usage.md#core-guided-hybrid-attention)."""

    keep: str = option(
        "5%,10%,20%,50%",
        help="how many heads are kept full: shares of all heads or counts, e.g. 10%% or 8",
        flag="--n-heads",
        aliases=("--keep",),
        type="k_list",
    )
    sets: str = option(
        "top,random,bottom",
        help="full sets: top (CoRe), random, bottom, layer-matched, stable (P(top-k) >= --stable-p), "
        "adaptive (the top set's count per layer, the heads chosen per prompt)",
        type=("names_of", HYBRID_SET_KINDS, "head set"),
    )
    stable_p: float = stable_p_option()
    rank_resamples: int = resamples_option("keep full")
    sink: str = option(
        "128", help="sink tokens S: a count, or a share of the median prompt (5%%)", type="token_size"
    )
    window: str = option(
        "1024", help="window W: a count, or a share of the median prompt (25%%)", type="token_size"
    )
    decode: str = option(
        "full",
        help="decoding after the hybrid prefill: full attention (the paper) or the streaming pattern",
        choices=("full", "stream"),
    )
    granularity: str | None = granularity_option("kept full")
    kernel: str = option(
        "auto",
        help="prefill kernel of the streaming heads (auto: flex on CUDA, blocked on the CPU; docs/methods.md#hybrid)",
        choices=KERNELS,
    )
    dense_below: float = option(
        DENSE_BELOW,
        help="the partitioned kernel's crossover: a layer whose head set's ideal speed-up is below it runs every "
        "head dense, as stock attention (0: never; the default is not yet measured on a GPU)",
        type=float,
    )
    policy: str | None = option(
        None,
        help="the policy each full set gets, with its parameters, instead of --decode / --kernel / --dense-below: "
        f'a name ({", ".join(HYBRID_POLICIES)}), JSON such as \'{{"name": "hybrid", "decode": "stream"}}\' or a '
        ".json file; S and W stay --sink / --window",
        type=("policy_of", HYBRID_POLICIES, "hybrid policy"),
        metavar="NAME|JSON",
    )
    seeds: object = _SEEDS
    control_width: float = _WIDTH
    max_draws: int = _MOST
    seed: int = option(0, help="base seed of the random draws", type=int)
    random_from: str = random_from_option()
    scorer: str = scorer_option()
    max_new_tokens: int = max_new_tokens_option()
    run: None = run_options("use the first N samples")

    def kwargs(self) -> dict:
        """The keyword arguments of `experiments.hybrid.curve` these settings make."""
        names = ("seeds", "control_width", "max_draws", "seed", "random_from", "sink", "window", "decode")
        names += (
            "scorer",
            "max_new_tokens",
            "rank_resamples",
            "stable_p",
            "granularity",
            "kernel",
            "dense_below",
            "policy",
        )
        return {"keeps": self.keep, "sets": _names(self.sets), **{n: getattr(self, n) for n in names}}


@dataclass(frozen=True)
class FrontierConfig:
    """The settings of `corelens frontier` (docs/usage.md#which-heads-the-frontier)."""

    model: str = model_option()
    data: str = data_option(EVAL_DATA)
    heads: list[str] = option(
        help="the rankings compared: heads.csv of rank runs or exported head sets, each PATH or LABEL=PATH "
        "(label: given, else the scorer the file records, else its folder's name)",
        nargs="+",
        setting=False,
    )
    out: str = out_option()
    budgets: str = option(
        "2,4,8,16", help="heads kept full (hybrid) / zeroed (ablation): counts or shares, e.g. 2,4,8 or 5%%,10%%",
        type="k_list",
    )  # fmt: skip
    granularity: str | None = option(
        None,
        help="unit the budgets count: query, kv or query,kv (both); default: each heads.csv's own",
        type=("names_of", ("query", "kv"), "granularity"),
    )
    sink: str = option(
        "128", help="hybrid sink tokens S: a count, or a share of the median prompt", type="token_size"
    )
    window: str = option(
        "1024", help="hybrid window W: a count, or a share of the median prompt", type="token_size"
    )
    draws: object = draw_options("the random control (drawn once, on the first ranking)")[0]
    control_width: float = _WIDTH
    max_draws: int = _MOST
    seed: int = option(0, help="base seed of the random draws", type=int)
    op: str = option("zero", help="ablation operator: docs/methods.md#interventions", choices=OPS)
    scorer: str = scorer_option()
    max_new_tokens: int = max_new_tokens_option()
    graded: str | None = option(
        None,
        help="also answer each method's cells under graded per-KV-head budgets (its scores, the binary cell's "
        "KV share): sink+window, top or sink+window,top; default: off",
        type=("names_of", GRADED_SELECTS, "graded select"),
    )
    run: None = run_options("use the first N samples")

    def kwargs(self) -> dict:
        """The keyword arguments of `experiments.frontier.frontier` these settings make."""
        names = (
            "budgets",
            "granularity",
            "sink",
            "window",
            "draws",
            "control_width",
            "max_draws",
            "seed",
            "op",
            "graded",
        )
        return {
            **{n: getattr(self, n) for n in names},
            "scorer": self.scorer,
            "max_new_tokens": self.max_new_tokens,
        }


def condition_table(records, conds: Iterable, row: Callable, columns: Sequence[str]):
    """Return a sweep's per-condition table (ablation.csv, hybrid.csv): one row per condition of `conds`,
    `row(c, got, scores)` of its answers `got` (its rows of `records`) and their `scores` (accuracy, n,
    correct and the Wilson interval ci_low / ci_high), in the order of `columns`; `seed` an integer column."""
    import pandas as pd

    from corelens.metrics.answers import interval

    rows = []
    for c in conds:
        got = records[records["condition"] == c.name]
        n, correct = len(got), int(got["correct"].sum()) if len(got) else 0
        low, high = interval(correct, n)
        scores = {"accuracy": correct / n if n else float("nan"), "n": n, "correct": correct}
        rows.append(row(c, got, {**scores, "ci_low": low, "ci_high": high}))
    table = pd.DataFrame(rows, columns=columns)
    table["seed"] = table["seed"].astype("Int64")
    return table


def summary_table(
    table,
    records,
    names: dict,
    seed: int = 0,
    *,
    key: str = "k",
    size: str = "k_heads",
    stopped: dict[tuple[str, str], str] | None = None,
):
    """Return one row per (set, k): mean accuracy over draws, their sd, and the interval.

    A set drawn once (top, bottom, or one draw) gets the Wilson interval of its answers; a set drawn several
    times gets the two-level bootstrap over draws and samples (`draws_interval`), which includes the
    variation between draws (`sd`). `names` maps each (set, k) row's conditions to their names in records.
    `draw_width` is the width of the t-interval of the mean over draws (`corelens.metrics.draws`, what
    `--seeds auto` narrows) and `stopped` why the draws stopped (`stopped`, by (set, k); "" for undrawn sets).
    `key` / `size` name the k and head-count columns (hybrid.csv: keep, full_heads).
    """
    import pandas as pd

    from corelens.metrics.answers import interval
    from corelens.metrics.headsets import SEEDED
    from corelens.metrics.uncertainty import draws_interval

    rows = []
    for (kind, k), group in table.groupby(["set", key], sort=False):
        correct, n = int(group["correct"].sum()), int(group["n"].sum())
        low, high = interval(correct, n)
        method = "wilson"
        if len(group) > 1:
            conds = [names[(kind, str(k), s)] for s in group["seed"]]
            got = records[records["condition"].isin(conds)]
            answers = got.pivot(index="condition", columns="sample", values="correct").dropna(axis=1)
            if answers.shape[1]:
                low, high = draws_interval(answers.to_numpy(dtype=float), seed=seed)
                method = "two-level bootstrap"
            if len(group) < FEW_DRAWS:  # two draws cannot say how far draws differ: no narrower than one
                each = [interval(int(c), int(m)) for c, m in zip(group["correct"], group["n"])]
                low, high = min([low, *(e[0] for e in each)]), max([high, *(e[1] for e in each)])
                method = "widest of draws (few draws)"
        drawn = kind in SEEDED
        d_low, d_high = draws.draw_interval(group["accuracy"]) if drawn else (float("nan"),) * 2
        rows.append(
            {
                "set": kind,
                key: k,
                size: int(group[size].iloc[0]),
                "short_by": int(group["short_by"].max()),
                "seeds": int(group["seed"].notna().sum()) or 1,
                "accuracy": float(group["accuracy"].mean()),
                "sd": float(group["accuracy"].std(ddof=1)) if len(group) > 1 else 0.0,
                "ci_low": low,
                "ci_high": high,
                "interval": method,
                "draw_width": d_high - d_low,
                "stopped": (stopped or {}).get((kind, str(k)), "fixed" if drawn else ""),
            }
        )
    return pd.DataFrame(rows)


@dataclass
class Tail:
    """What a finished sweep hands to `conclude_sweep`: its outputs, the per-condition `table` and per-answer
    `records`, the condition names by (set, k, seed), the controls `found` and how they were drawn."""

    outputs: object  # corelens.runs.outputs.Outputs: ABLATE or HYBRID
    table: object  # pandas.DataFrame, one row per condition
    records: object  # pandas.DataFrame, one row per (condition, sample)
    names: dict
    found: list  # corelens.metrics.draws controls
    task: str
    seed: int
    key: str  # the size column: "k" (ablate) or "keep" (hybrid)
    size: str  # the head-count column: "k_heads" or "full_heads"
    control_width: float
    max_draws: int
    auto: bool


def conclude_sweep(
    run,
    tail: Tail,
    resampled: Iterable | None,
    *,
    draw: Callable[[Mapping[str, Path]], None],
    manifest: Mapping[str, object] | None = None,
    **finish: object,
):
    """The sweeps' tail: the per-(set, k) summary, the summary over ranking resamples (`resampled`: the
    (k, heads) of each resampled set, None without --rank-resamples), the declared tables and figure, the
    run's end, and one line per control on stderr. Return (summary, resampled summary or None)."""
    from corelens.metrics.uncertainty import resampled_summary
    from corelens.runs.outputs import conclude

    stopped = {(c.kind, c.k): c.stopped for c in tail.found}
    summary = summary_table(
        tail.table, tail.records, tail.names, tail.seed, key=tail.key, size=tail.size, stopped=stopped
    )
    summary.insert(0, "task", tail.task)
    over = resampled_summary(tail.table, tail.key, resampled) if resampled is not None else None
    entries = {**(manifest or {})}
    entries["controls"] = draws.manifest(tail.found, tail.task, tail.control_width, tail.max_draws, tail.auto)
    tables = {"records": tail.records, "table": tail.table, "summary": summary, "resampled": over}
    conclude(run, tail.outputs, tables, draw=draw, manifest=entries, **finish)
    if run is None or run.dist.main:
        for c in tail.found:
            print(
                f"{tail.outputs.command}: {tail.task}: {c.line(tail.control_width, tail.max_draws)}",
                file=sys.stderr,
            )
    return summary, over


def run_sweep(entry: Callable, config, ctx, load_options: dict):
    """`corelens ablate` / `corelens hybrid`: resolve the config's heads (a heads.csv, an exported head set or
    its hub id) before the model loads, load the model, and run `entry` (`ablate.sweep`, `hybrid.curve`) on
    the config's data under `ctx`."""
    from corelens.heads import resolve_heads
    from corelens.models.loaded import load

    heads = resolve_heads(config.heads)
    if not Path(heads).is_file():  # the sweep's own refusal, before the model loads rather than after
        raise CorelensError(f"{heads}: no such head table (expected a rank run's heads.csv)")
    return entry(load(config.model, **load_options), config.data, heads, ctx=ctx, **config.kwargs())


def run_on_path(
    entry: Callable,
    model: str | Path,
    data: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    load_options: dict | None = None,
    **kwargs,
):
    """Load `model` (with `load()`'s `load_options`) and run `entry` (`ablate.sweep`, `hybrid.curve`) into
    run directory `out`."""
    from corelens.models.loaded import load

    return entry(load(model, **(load_options or {})), data, heads, out=out, **kwargs)
