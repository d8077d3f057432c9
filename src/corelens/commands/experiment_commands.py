"""What the experiment commands print (`show_NAME`), and the `demo` command, which has a parser of its own.

Each experiment command (rank, stability, ablate, hybrid, frontier, importance, flow, sap) is the generic
driver (`corelens.commands.options.experiment_command`) specialised with its entry in the experiment registry
(`corelens.experiment_registry`), which names its printer here as "module:function". Nothing here imports an
experiment, torch or transformers at module level: `corelens demo --help` answers without them
(tests/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import sys

from corelens.commands.argtypes import output_path, positive
from corelens.commands.options import Command
from corelens.commands.shared import add_model_options, load_options


def print_resampled(result, resamples: int) -> None:
    """Print the table of results over ranking resamples, where the run made one (ablate, hybrid)."""
    if result.resampled is not None:
        print(f"top-k over {resamples} resamples of the ranking (median, 90 % interval):")
        print(result.resampled.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def show_rank(ranking, config) -> None:
    """Print the top heads and those whose top-k membership is uncertain."""
    unit = "KV" if ranking.granularity == "kv" else "H"
    best = ", ".join(f"L{layer}{unit}{head}" for layer, head in ranking.top(5))
    score = "RAM" if config.score == "ram" else f"{config.score} score"
    what = f"KV heads ({config.kv_rule} of their query heads' {score})" if unit == "KV" else "heads"
    print(f"ranked {ranking.ram['sample_id'].nunique()} samples; top {what}: {best}")
    for column in [c for c in ranking.heads.columns if c.startswith("p_top")]:
        edge = ranking.heads[(ranking.heads[column] > 0.2) & (ranking.heads[column] < 0.8)]
        rows = edge[["layer", "head", column]].to_numpy()
        names = ", ".join(f"L{int(layer)}{unit}{int(head)} ({p:.2f})" for layer, head, p in rows) or "none"
        print(f"top-{column.removeprefix('p_top')} membership uncertain (0.2 < P < 0.8): {names}")
    print(f"wrote {config.out}/heads.csv, ram.parquet, manifest.json, figures/heads_mass.png")


def show_ablate(result, config) -> None:
    """Print the per-(set, k) summary, the resampled tops' table and what was written."""
    from corelens.metrics.draws import known

    table = result.summary.copy()
    if "draw_width" in table.columns:  # the mean over draws, in points of accuracy, or "not known yet"
        drawn = table["stopped"].astype(str) != ""
        table["draw_width"] = [
            known(w).split(" (")[0] if d else "" for w, d in zip(table["draw_width"], drawn)
        ]
        table = table.rename(columns={"draw_width": "mean_over_draws"})
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("accuracy and ci_low / ci_high (95 %) are shares of the answers right; seeds: draws of the set")
    print_resampled(result, config.rank_resamples)
    extra = ", resampled.csv" if result.resampled is not None else ""
    print(
        f"wrote {config.out}/ablation.csv, ablation_summary.csv{extra}, records.parquet, figures/dose_response.png"
    )


def show_importance(result, config) -> None:
    """Print the heads with the largest causal effect and what was written."""
    table = result["table"].sort_values("causal_rank")
    columns = ["layer", "head", "ram", "ram_rank", "effect", "drop_logp_low", "drop_logp_high", "drop_acc",
               "attribution", "causal_rank", "rank_diff"]  # fmt: skip
    print(table[columns].head(12).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {config.out}/importance.csv, summary.json, records.parquet, figures/ram_vs_causal.png")


def run_demo(args: argparse.Namespace) -> None:
    """Run the demo."""
    print(
        "corelens demo: loading torch, transformers and the bundled model", flush=True
    )  # seconds of imports
    from corelens.experiments.demo import run_demo as demo_experiment

    demo_experiment(args.out, model=args.model, n=args.n, eval_n=args.eval_n, load_options=load_options(args))


def register_demo(sub) -> None:
    """Add the `demo` parser."""
    d = sub.add_parser("demo", help="the main job on the bundled default model")
    d.add_argument(
        "--out", type=output_path, default="runs/demo", help="folder of the demo's runs and report.html"
    )
    add_model_options(d, required=False)
    d.set_defaults(model=None)
    # The defaults are corelens.experiments.demo's RANK_N and EVAL_N, written out here so that parsing the
    # command line imports no experiment (and so no torch); tests/test_demo.py checks they agree.
    d.add_argument("--n", type=positive, default=32, help="samples ranked per task")
    d.add_argument(
        "--eval-n", type=positive, default=16, help="samples evaluated per condition (ablation, hybrid)"
    )
    d.set_defaults(func=run_demo)


demo = Command(run_demo, register_demo)


def show_flow(result, config) -> None:
    """Print the Table-1 analogue and what was written."""
    cols = ["row", "samples", "rid", "dS", "dD", "mixig", "paper_rid", "paper_mixig"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {config.out}/flow.parquet, table1.csv, layers.csv, manifest.json, figures/flow_layers.png")


def show_sap(result, config) -> None:
    """Print accuracy per condition, the key-region ratio and the priors' mass on Ω."""
    fmt = {"float_format": lambda v: f"{v:.3f}", "index": False}
    print(result.accuracy.to_string(**fmt))
    print(result.key_region.to_string(**fmt))
    print(result.priors.to_string(**fmt))
    print(
        f"wrote {config.out}/sap.parquet, accuracy.csv, key_region.csv, priors.csv, manifest.json, "
        "figures/sap_accuracy.png"
    )


def show_hybrid(result, config) -> None:
    """Print the per-condition table, the crossover's dense share, S / W and what was written."""
    cols = ["set", "keep", "full_heads", "kv_full_heads", "seed", "accuracy", "n", "ci_low", "ci_high"]
    cols += ["cache_kept_fraction", "cache_saved_fraction", "prompt_covered"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        "cache_kept_fraction: share of the KV cache a trimmed cache would keep (analytic); cache_saved_fraction: "
        "share this run's decoding saved (0 with --decode full); prompt_covered: share of the prompts S + W "
        "covers whole (there hybrid attention changes nothing). Terms: docs/methods.md#hybrid"
    )
    print_resampled(result, config.rank_resamples)
    dense = result.table[result.table["dense_prefills"] > 0]
    if len(dense):
        print(
            f"the partitioned kernel's crossover (--dense-below {config.dense_below}) ran every head dense in "
            f"{dense['dense_prefills'].mean():.0%} of the layer prefills of {len(dense)} condition(s) "
            "(hybrid.csv: dense_prefills; manifest.json: prefill)",
            file=sys.stderr,
        )
    print(
        f"S = {result.sink}, W = {result.window} tokens, decode {config.decode}; "
        f"median prompt {result.median_tokens:.0f} tokens"
    )
    print(f"wrote {config.out}/hybrid.csv, records.parquet, policies.json, figures/hybrid.png")


def show_stability_curve(info: dict, config) -> None:
    """Print from which n the top-k (and Spearman) settle, and what was written."""
    from corelens.experiments.stability import CURVE

    half = info["samples"] // 2
    for name, n in info["first_n_at_0.9"].items():
        label = name.replace("jaccard_top", "top-") + (" Jaccard" if name != "spearman" else "")
        print(f"{label} >= 0.9 from n = {n}" if n else f"{label} < 0.9 up to n = {half} (half the samples)")
    print(f"wrote {config.curve}/{CURVE}.csv, {CURVE}.json, figures/{CURVE}.png")


def show_stability(result, config) -> None:
    """Print the Spearman pairs, each run's sparsity and the universal heads (or, with --curve, the curve)."""
    if config.curve:
        return show_stability_curve(result, config)
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


def show_frontier(result, config) -> None:
    """Print the smallest budgets, the rankings' agreement and what was written."""
    print(result.budgets.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if len(result.rankings):
        print(result.rankings.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(
        f"wrote {config.out}/frontier.csv, frontier_budgets.csv, rankings.csv, figures/frontier.png, methods/"
    )
