"""`corelens importance`: each head's single-head effect on the answer beside its RAM (docs/importance.md)."""

from __future__ import annotations

from functools import partial

from corelens.commands.options import register_experiment, run_experiment


def show(result, config) -> None:
    """Print the heads with the largest causal effect and what was written."""
    table = result["table"].sort_values("causal_rank")
    columns = ["layer", "head", "ram", "ram_rank", "effect", "drop_logp_low", "drop_logp_high", "drop_acc",
               "attribution", "causal_rank", "rank_diff"]  # fmt: skip
    print(table[columns].head(12).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {config.out}/importance.csv, summary.json, records.parquet, figures/ram_vs_causal.png")


CONFIG = "corelens.experiments.configs:ImportanceConfig"
run = partial(run_experiment, config=CONFIG, entry="corelens.experiments.importance:run_command", show=show)
register = partial(
    register_experiment,
    name="importance",
    help="measure each head's causal effect on the answer beside its RAM",
    config=CONFIG,
    run=run,
)
