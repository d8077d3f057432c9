"""`corelens ablate`: ablate head sets from a rank run and measure accuracy (dose-response)."""

from __future__ import annotations

from functools import partial

from corelens.commands.common import print_resampled
from corelens.commands.options import register_experiment, run_experiment


def show(result, config) -> None:
    """Print the per-(set, k) summary, the resampled tops' table and what was written."""
    print(result.summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print_resampled(result, config.rank_resamples)
    extra = ", resampled.csv" if result.resampled is not None else ""
    print(
        f"wrote {config.out}/ablation.csv, ablation_summary.csv{extra}, records.parquet, figures/dose_response.png"
    )


CONFIG = "corelens.experiments.sweep:AblateConfig"
run = partial(run_experiment, config=CONFIG, entry="corelens.experiments.ablate:run_command", show=show)
register = partial(
    register_experiment,
    name="ablate",
    help="ablate top / bottom / random head sets and measure accuracy",
    config=CONFIG,
    run=run,
)
