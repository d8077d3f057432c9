"""`corelens hybrid`: accuracy vs heads kept full under CoRe-guided hybrid attention (docs/methods.md#hybrid)."""

from __future__ import annotations

import sys

from corelens.commands.common import print_resampled
from corelens.commands.options import experiment_command


def show(result, config) -> None:
    """Print the per-condition table, the crossover's dense share, S / W and what was written."""
    cols = ["set", "keep", "full_heads", "kv_full_heads", "seed", "accuracy", "n", "ci_low", "ci_high"]
    cols += ["cache_kept_fraction", "cache_saved_fraction"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
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


CONFIG, ENTRY = "corelens.experiments.sweep:HybridConfig", "corelens.experiments.hybrid:run_command"
run, register = experiment_command(
    "hybrid", "accuracy vs heads kept full under hybrid (full + streaming) attention", CONFIG, ENTRY, show
)
