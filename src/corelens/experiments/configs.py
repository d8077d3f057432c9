"""Every experiment's settings: one frozen dataclass per command, its fields the command's options (in the
order of its help) and its manifest's settings (`corelens.runs.fields.option`).

This module imports neither torch nor transformers: a command generates its parser from these classes while
the command line is parsed (`corelens.commands.options.add_config`), before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

from corelens.choices import (
    BASELINES,
    CONVENTIONS,
    DEFAULT_ALPHA,
    DEFAULT_RULE,
    GRANULARITIES,
    HEAD_SCORES,
    KEY_SETS,
    POSITION_SETS,
    PRIOR_NAMES,
    PRIORS,
    REFERENCES,
    ROPE_ON,
    RULES,
    SCORERS,
)
from corelens.runs.context import RunContext
from corelens.runs.fields import (
    data_option,
    limits_options,
    model_option,
    option,
    out_option,
    repair_log_option,
    run_options,
    skip_bad_option,
)

PIXELS, PAGES = limits_options()

# An option of the scorers' settings block (see RankConfig's `sink`): recorded through the scorer, not by itself.
score_setting = partial(option, group="score", setting=False)


IMPORTANCE_OPS = ("zero", "knockout")  # the single-head operators attribution patching supports too


@dataclass(frozen=True)
class RankConfig:
    """The settings of `corelens rank` (and of `rank()`): one field per option, in the order of its help."""

    model: str = model_option()
    data: str = data_option()
    out: str = out_option()
    score: str = option(
        "ram",
        help="the head score ranked: RAM, the retrieval (top-1 key in Omega) score, the attention mass outside "
        "sink + window, the single-head causal effect, DuoAttention's learned gates, or a greedy joint "
        "selection (docs/methods.md#head-scores)",
        choices=HEAD_SCORES,
    )
    query: str = option(
        "question",
        help="attention rows measured: the question's tokens, the last prompt token, or the answer's",
        choices=("question", "last", "answer"),
    )
    rule: str = option("any", help="box -> token rule", choices=("any", "centre", "coverage"))
    padding: str = option(
        "visual",
        help="cells that hold only padding: in V not Omega (visual), in both (omega), in neither (none)",
        choices=("visual", "omega", "none"),
    )
    omega: str = option(
        "targets",
        help="Omega from the samples' targets, or estimated from the model (no annotation needed)",
        choices=("targets", "causal"),
    )
    estimator: str = option("occlusion", help="causal Omega", choices=("occlusion", "gradient"))
    omega_grid: int = option(4, help="occlusion: coarse blocks per segment side", type=int)
    omega_refine: int = option(2, help="occlusion: coarse blocks refined per cell", type=int)
    omega_ratio: float = option(0.5, help="keep cells scoring >= ratio x the best", type=float)
    omega_batch: int = option(8, help="occlusion: occluded copies per forward", type=int)
    run: None = run_options()
    overlays: int = option(2, help="draw top/bottom heads' attention on the first N samples", type=int)
    explorer: int = option(
        0,
        help="store quantised per-head attention maps of the first N samples for the report's head explorer "
        "(0, the default: none; the demo stores 8 per task: each costs one more forward pass, on rank 0)",
        type=int,
    )
    k: str | list[str] | None = option(
        "1%,5%,10%",
        help="top-k sizes for the bootstrap P(top-k) columns of heads.csv: counts or shares, e.g. 1%%,5%% or 8",
        type="k_list",
    )
    granularity: str = option(
        "query",
        help="rank query heads, or KV heads scored from their query heads (heads.csv then lists KV heads "
        "and --k counts them; docs/methods.md#kv-heads); gates and greedy then learn / select whole KV heads",
        choices=GRANULARITIES,
    )
    kv_rule: str = option(
        DEFAULT_RULE,
        help="--granularity kv: a KV head's score from its query heads' RAM: sum (default, as SparseMM), "
        "mean (same ranking) or max (the best member per sample)",
        choices=RULES,
    )
    n_boot: int = option(
        1000,
        help="posterior draws of the head means for the intervals and P(top-k) in heads.csv",
        type="count",
    )
    seed: int = option(0, help="seed of the bootstrap resamples", type=int)
    # The scorers' settings (`--score`), each named like the field of its scorer class; the manifest records
    # them through the scorer (settings key `score`), not one by one.
    sink: str = score_setting(
        "128",
        help="outside-window: sink tokens S, a count or a share of each prompt (4, 5%%); gates, greedy: a count",
        type="token_size",
    )
    window: str = score_setting(
        "1024",
        help="outside-window: recent keys W, a count or a share of each prompt (16, 25%%); gates, greedy: a count",
        type="token_size",
    )
    all_answers: bool = score_setting(
        False,
        help="retrieval: count every answer, not only the correct ones",
        action="store_true",
    )
    gate_loss: str = score_setting(
        "hidden",
        help="gates: distance to the dense model at the answer rows: final hidden states (mean squared "
        "error, DuoAttention's) or the answer's negative log-likelihood",
        choices=("hidden", "logp"),
    )
    gate_lambda: float = score_setting(0.05, help="gates: weight of mean(alpha) in the loss", type=float)
    gate_lr: float = score_setting(0.02, help="gates: Adam's learning rate", type=float)
    gate_epochs: int = score_setting(2, help="gates: passes over the samples", type=int)
    gate_batch: int = score_setting(4, help="gates: samples per step", type=int)
    gate_seed: int = score_setting(0, help="gates: seed of the sample order", type=int)
    greedy_mode: str = score_setting(
        "hybrid",
        help="greedy: grow the set of full heads under hybrid attention (largest gain in log p) or of zeroed "
        "heads (largest loss)",
        choices=("hybrid", "ablate"),
    )
    greedy_budget: int = score_setting(8, help="greedy: heads selected", type=int)
    greedy_batch: int = score_setting(
        32,
        help="greedy: candidate sets per forward (0: one per forward, by policy)",
        type=int,
    )
    op: str = score_setting(
        "zero",
        help="causal: single-head operator (docs/methods.md#interventions)",
        choices=IMPORTANCE_OPS,
    )
    keys: str = score_setting("visual", help="causal: knockout key set", choices=KEY_SETS)
    effect: str = score_setting(
        "exact",
        help="causal: exact log-p drop (one forward per head) or its attribution-patching estimate",
        choices=("exact", "attribution"),
    )

    @property
    def omega_settings(self):
        """The causal-Ω estimator's settings (None: Ω from the targets)."""
        if self.omega != "causal":
            return None
        from corelens.capture.omega import OmegaSettings

        return OmegaSettings(
            self.estimator, self.omega_grid, self.omega_refine, self.omega_ratio, self.omega_batch
        )

    def settings(self, m, data: str | Path, ctx: RunContext) -> dict:
        """The manifest's settings (a resumed run must match them); `m` is the loaded model."""
        from corelens.runs import model_data_settings

        omega = self.omega_settings
        return {
            **model_data_settings(m, data),
            "query": self.query,
            "rule": self.rule,
            "padding": self.padding,
            "limit": ctx.limit,
            "skip_bad": ctx.skip_bad,
            "seed": 0,
            "omega": {"source": "causal", **omega.to_json()} if omega else {"source": "targets"},
        }


def scorer_option(
    help: str = "how an answer is scored: exact match, a choice letter, yes/no; auto picks by the gold answer",
) -> object:
    """--scorer: how an answer is scored."""
    return option("auto", help=help, choices=SCORERS)


def max_new_tokens_option(type: str | type = int) -> object:
    """--max-new-tokens: the greedy answer's length."""
    return option(8, help="greedy answer length in tokens", type=type)


def _items(values: list[str] | None, default: tuple[str, ...]) -> list[str]:
    """The names of a comma-list option given once or repeated (`default` when not given)."""
    if not values:
        return list(default)
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@dataclass(frozen=True)
class SapConfig:
    """The settings of `corelens sap` (docs/usage.md#residual-geometry-and-attention-priors)."""

    model: str = model_option()
    data: str = data_option("samples (JSONL) with answers")
    out: str = out_option()
    prior: list[str] | None = option(
        None,
        help=f"comma list or repeated; of {', '.join(PRIOR_NAMES)} (default: {', '.join(PRIORS)})",
        action="append",
        type=("names_of", PRIOR_NAMES, "prior"),
    )
    layers: list[str] | None = option(
        None,
        help="layer set, repeat for a sweep: all, early, middle, late (default), first:N, last:N, 21-27,29",
        action="append",
        type="layer_set",
    )
    heads: str = option("all", help="all, 0-3,7, or band:P0-P1 (percentiles of visual mass)", type="head_set")
    convention: str = option("mass", help="how the prior is written", choices=CONVENTIONS)
    prior_temperature: float = option(
        1.0,
        help="T of the key and complexity priors, softmax(x / T) of values in [0, 1]: lower is sharper",
        type=float,
    )
    scorer: str = scorer_option()
    max_new_tokens: int = max_new_tokens_option()
    seed: int = option(0, help="seed of the noise prior", type=int)
    run: None = run_options()

    def kwargs(self) -> dict:
        """The keyword arguments of `experiments.sap.sap` these settings make."""
        return {
            "priors": _items(self.prior, PRIORS),
            "layers": self.layers or ["late"],
            "heads": self.heads,
            "convention": self.convention,
            "prior_temperature": self.prior_temperature,
            "scorer": self.scorer,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class FlowConfig:
    """The settings of `corelens flow` (docs/usage.md#residual-geometry-and-attention-priors)."""

    model: str = model_option()
    data: str = data_option()
    out: str = out_option()
    baseline: list[str] | None = option(
        None,
        help="repeat to run several; default: all three (fills every row of Table 1)",
        action="append",
        choices=BASELINES,
    )
    reference: str = option("module", help="'layer': FFN vs layer input", choices=REFERENCES)
    positions: str = option("all", help="prompt positions measured", choices=POSITION_SETS)
    rank: str = option("numerical", help="kept directions of X", choices=("numerical", "energy"))
    rank_eps: float | None = option(None, help="epsilon of the rank threshold (fp32's)", type=float)
    energy: float = option(0.99, help="share of Σσ² kept by --rank energy", type=float)
    tme_rows: str = option(
        "mean", help="TME of the mean over the rows, or of the last row only", choices=("mean", "last")
    )
    alpha: float = option(
        DEFAULT_ALPHA, help="TME sharpening exponent (1: the unsharpened W; authors' code: 8)", type=float
    )
    mixig_of: str = option(
        "output",
        help="MixIG's TME of the module's output X', or of its update ΔX",
        choices=("output", "delta"),
    )
    no_rope: bool = option(False, help="skip the ε_RoPE measurement", action="store_true")
    rope_on: str = option(
        "delta", help="ε_RoPE between attention outputs Δ (default) or residual states X + Δ", choices=ROPE_ON
    )
    seed: int = option(0, help="seed of the noise baselines", type=int)
    run: None = run_options()

    def kwargs(self) -> dict:
        """The keyword arguments of `experiments.flow.flow` these settings make (its `FlowOptions`)."""
        from corelens.experiments.flow import FlowOptions
        from corelens.metrics.spectra import FP32_EPS

        options = FlowOptions(
            reference=self.reference,
            positions=self.positions,
            rank=self.rank,
            eps=self.rank_eps if self.rank_eps is not None else FP32_EPS,
            energy=self.energy,
            tme_rows=self.tme_rows,
            alpha=self.alpha,
            mixig_of=self.mixig_of,
            rope=not self.no_rope,
            rope_on=self.rope_on,
            seed=self.seed,
        )
        return {"baselines": tuple(self.baseline or BASELINES), "options": options}


IMPORTANCE_METHODS = ("exact", "attribution", "both")


@dataclass(frozen=True)
class ImportanceConfig:
    """The settings of `corelens importance` (docs/importance.md)."""

    model: str = model_option()
    data: str = data_option(
        "samples with answers, NOT those the heads were ranked on (refused when it is the rank run's file)"
    )
    heads: str = option(
        help="heads.csv of a rank run (its RAM and rank)", type="existing_path", setting=False
    )
    out: str = out_option()
    op: str = option(
        "zero", help="single-head operator: docs/methods.md#interventions", choices=IMPORTANCE_OPS
    )
    keys: str = option("visual", help="knockout key set", choices=KEY_SETS)
    method: str = option(
        "both",
        help="exact single-head interventions, attribution patching (one forward + backward per sample), or both",
        choices=IMPORTANCE_METHODS,
    )
    scorer: str = scorer_option("how a greedy answer is scored")
    max_new_tokens: int = max_new_tokens_option("positive")
    limit: int | None = option(None, help="use the first N good samples", aliases=("--n",), type=int)
    skip_bad: bool = skip_bad_option()
    allow_same_data: bool = option(
        False, help="measure on the rank run's own data anyway (with a warning)", action="store_true"
    )
    draws: int = option(1000, help="posterior draws behind the intervals", type="count")
    seed: int = option(0, help="seed of the interval draws", type=int)
    repair_log: bool = repair_log_option()
    max_pixels: int = PIXELS
    max_pages: int = PAGES

    def kwargs(self) -> dict:
        """The keyword arguments of `experiments.importance.measure` these settings make."""
        names = ("op", "keys", "method", "scorer", "max_new_tokens", "allow_same_data", "draws", "seed")
        return {n: getattr(self, n) for n in names}


@dataclass(frozen=True)
class StabilityConfig:
    """The settings of `corelens stability` (docs/usage.md#how-sure-is-a-ranking-ranking-uncertainty)."""

    runs: list[str] = option(
        help="rank run directories (two or more)", positional=True, nargs="*", type="existing_path"
    )
    out: str | None = option(None, help="run directory to write (not with --curve)", type="output_path")
    curve: str | None = option(
        None,
        help="write RUN's stability curve into it: top-k Jaccard and Spearman of two disjoint n-sample rankings",
        type="existing_path",
        metavar="RUN",
    )
    k: str = option(
        "5%",
        help="top-k for Jaccard / universal heads / depth: a count or N%% (--curve: a list)",
        type="k_list",
    )
    pairs: int = option(200, help="--curve: random subset pairs per n", type="count")
    n_boot: int = option(
        1000, help="posterior draws of each run's means for the Spearman intervals", type="count"
    )
    seed: int = option(0, help="seed of the bootstrap and subset draws", type=int)
