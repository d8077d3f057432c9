"""`corelens flow`: residual-stream geometry (RID, MixIG) of every decoder module, with baselines."""

from __future__ import annotations

from corelens.commands.options import experiment_command


def show(result, config) -> None:
    """Print the Table-1 analogue and what was written."""
    cols = ["row", "samples", "rid", "dS", "dD", "mixig", "paper_rid", "paper_mixig"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {config.out}/flow.parquet, table1.csv, layers.csv, manifest.json, figures/flow_layers.png")


CONFIG, ENTRY = "corelens.experiments.configs:FlowConfig", "corelens.experiments.flow:run_command"
run, register = experiment_command(
    "flow", "RID / MixIG of every attention and FFN module: docs/methods.md#geometry", CONFIG, ENTRY, show
)
