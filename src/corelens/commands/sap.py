"""`corelens sap`: accuracy with shared attention priors in place of learned visual attention (docs/methods.md#sap)."""

from __future__ import annotations

from functools import partial

from corelens.commands.options import register_experiment, run_experiment


def show(result, config) -> None:
    """Print accuracy per condition, the key-region ratio and the priors' mass on Ω."""
    fmt = {"float_format": lambda v: f"{v:.3f}", "index": False}
    print(result.accuracy.to_string(**fmt))
    print(result.key_region.to_string(**fmt))
    print(result.priors.to_string(**fmt))
    print(
        f"wrote {config.out}/sap.parquet, accuracy.csv, key_region.csv, priors.csv, manifest.json, "
        "figures/sap_accuracy.png"
    )


CONFIG = "corelens.experiments.configs:SapConfig"
run = partial(run_experiment, config=CONFIG, entry="corelens.experiments.sap:run_command", show=show)
register = partial(
    register_experiment,
    name="sap",
    help="accuracy with attention priors in place of learned visual attention",
    config=CONFIG,
    run=run,
)
