"""`corelens sap`: accuracy with shared attention priors in place of learned visual attention (docs/methods.md#sap)."""

from __future__ import annotations

from corelens.commands.options import experiment_command


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


CONFIG, ENTRY = "corelens.experiments.configs:SapConfig", "corelens.experiments.sap:run_command"
run, register = experiment_command(
    "sap", "accuracy with attention priors in place of learned visual attention", CONFIG, ENTRY, show
)
