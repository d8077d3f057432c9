"""Every experiment's settings: one frozen dataclass per command, its fields the command's options (in the
order of its help) and its manifest's settings (`corelens.runs.config.option`).

This module imports neither torch nor transformers: a command generates its parser from these classes while
the command line is parsed (`corelens.commands.options.add_config`), before any model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from corelens.choices import DEFAULT_RULE, GRANULARITIES, RULES
from corelens.runs.config import (
    data_option,
    limit_option,
    limits_options,
    model_option,
    option,
    out_option,
    repair_log_option,
    skip_bad_option,
)
from corelens.runs.context import RunContext

_PIXELS, _PAGES = limits_options()


@dataclass(frozen=True)
class RankConfig:
    """The settings of `corelens rank` (and of `rank()`): one field per option, in the order of its help."""

    model: str = model_option()
    data: str = data_option()
    out: str = out_option()
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
    limit: int | None = limit_option()
    skip_bad: bool = skip_bad_option()
    repair_log: bool = repair_log_option()
    max_pixels: int = _PIXELS
    max_pages: int = _PAGES
    overlays: int = option(2, help="draw top/bottom heads' attention on the first N samples", type=int)
    explorer: int = option(
        0,
        help="store quantised per-head attention maps of the first N samples for the report's head explorer "
        "(0, the default: none; the demo stores 200: each costs one more forward pass, on rank 0)",
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
        "and --k counts them; docs/methods.md#kv-heads)",
        choices=GRANULARITIES,
    )
    kv_rule: str = option(
        DEFAULT_RULE,
        help="--granularity kv: a KV head's score from its query heads' RAM: sum (default, as SparseMM), "
        "mean (same ranking) or max (the best member per sample)",
        choices=RULES,
    )
    n_boot: int = option(
        1000, help="posterior draws of the head means for the intervals and P(top-k) in heads.csv", type=int
    )
    seed: int = option(0, help="seed of the bootstrap resamples", type=int)

    @property
    def omega_settings(self):
        """The causal-Ω estimator's settings (None: Ω from the targets)."""
        if self.omega != "causal":
            return None
        from corelens.experiments.omega import OmegaSettings

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
