"""`corelens stability`: compare rank runs of different tasks or models (Spearman, Jaccard, universal heads)."""

from __future__ import annotations

from corelens.commands.options import experiment_command


def show_curve(info: dict, config) -> None:
    """Print from which n the top-k (and Spearman) settle, and what was written."""
    from corelens.experiments.stability import CURVE

    half = info["samples"] // 2
    for name, n in info["first_n_at_0.9"].items():
        label = name.replace("jaccard_top", "top-") + (" Jaccard" if name != "spearman" else "")
        print(f"{label} >= 0.9 from n = {n}" if n else f"{label} < 0.9 up to n = {half} (half the samples)")
    print(f"wrote {config.curve}/{CURVE}.csv, {CURVE}.json, figures/{CURVE}.png")


def show(result, config) -> None:
    """Print the Spearman pairs, each run's sparsity and the universal heads (or, with --curve, the curve)."""
    if config.curve:
        return show_curve(result, config)
    for row in result.spearman.itertuples():
        print(f"{row.a} vs {row.b}: Spearman {row.spearman:.3f} [{row.low:.3f}, {row.high:.3f}]")
    for row in result.topology.itertuples():
        print(
            f"{row.run}: {row.heads_for_50pct:.1%} of heads hold 50 % of the mass, "
            f"{row.heads_for_80pct:.1%} hold 80 %; Gini {row.gini:.3f}"
        )
    universal = ", ".join(f"L{layer}H{head}" for layer, head in result.universal) or "none"
    print(f"universal heads (top-{config.k} of every run): {universal}")
    print(
        f"wrote {config.out}/spearman.csv, jaccard.csv, universal.csv, core_set.csv, topology.csv, depth.csv, figures/"
    )


CONFIG, ENTRY = "corelens.experiments.configs:StabilityConfig", "corelens.experiments.stability:run_command"
run, register = experiment_command(
    "stability", "cross-task / cross-model stability of rank runs", CONFIG, ENTRY, show
)
