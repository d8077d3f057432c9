"""`corelens importance`: each head's single-head effect on the answer beside its RAM (docs/importance.md)."""

from __future__ import annotations

from corelens.commands.options import experiment_command


def show(result, config) -> None:
    """Print the heads with the largest causal effect and what was written."""
    table = result["table"].sort_values("causal_rank")
    columns = ["layer", "head", "ram", "ram_rank", "effect", "drop_logp_low", "drop_logp_high", "drop_acc",
               "attribution", "causal_rank", "rank_diff"]  # fmt: skip
    print(table[columns].head(12).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {config.out}/importance.csv, summary.json, records.parquet, figures/ram_vs_causal.png")


CONFIG, ENTRY = "corelens.experiments.configs:ImportanceConfig", "corelens.experiments.importance:run_command"
run, register = experiment_command(
    "importance", "measure each head's causal effect on the answer beside its RAM", CONFIG, ENTRY, show
)
