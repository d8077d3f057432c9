"""`corelens ablate`: ablate head sets from a rank run and measure accuracy (dose-response)."""

from __future__ import annotations

from corelens.commands.common import print_resampled
from corelens.commands.options import experiment_command


def show(result, config) -> None:
    """Print the per-(set, k) summary, the resampled tops' table and what was written."""
    print(result.summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print_resampled(result, config.rank_resamples)
    extra = ", resampled.csv" if result.resampled is not None else ""
    print(
        f"wrote {config.out}/ablation.csv, ablation_summary.csv{extra}, records.parquet, figures/dose_response.png"
    )


CONFIG, ENTRY = "corelens.experiments.sweep:AblateConfig", "corelens.experiments.ablate:run_command"
run, register = experiment_command(
    "ablate", "ablate top / bottom / random head sets and measure accuracy", CONFIG, ENTRY, show
)
