"""`corelens rank`: rank heads by Retrieval Attention Mass."""

from __future__ import annotations

import argparse

from corelens.commands.common import load_options, main_process
from corelens.commands.options import add_config, config_of, context_of


def run(args: argparse.Namespace) -> None:
    """Rank the heads of a checkpoint on a sample file into a run directory."""
    from corelens.experiments.configs import RankConfig
    from corelens.experiments.rank import run_command

    ranking = run_command(config_of(RankConfig, args), context_of(args), load_options(args))
    if not main_process():
        return
    unit = "KV" if ranking.granularity == "kv" else "H"
    best = ", ".join(f"L{layer}{unit}{head}" for layer, head in ranking.top(5))
    what = f"KV heads ({args.kv_rule} of their query heads' RAM)" if unit == "KV" else "heads"
    print(f"ranked {ranking.ram['sample_id'].nunique()} samples; top {what}: {best}")
    for column in [c for c in ranking.heads.columns if c.startswith("p_top")]:
        edge = ranking.heads[(ranking.heads[column] > 0.2) & (ranking.heads[column] < 0.8)]
        rows = edge[["layer", "head", column]].to_numpy()
        names = ", ".join(f"L{int(layer)}{unit}{int(head)} ({p:.2f})" for layer, head, p in rows) or "none"
        print(f"top-{column.removeprefix('p_top')} membership uncertain (0.2 < P < 0.8): {names}")
    print(f"wrote {args.out}/heads.csv, ram.parquet, manifest.json, figures/heads_mass.png")


def register(sub) -> None:
    """Add the `rank` parser: its options are `RankConfig`'s fields."""
    from corelens.experiments.configs import RankConfig

    r = sub.add_parser("rank", help="rank heads by Retrieval Attention Mass")
    add_config(r, RankConfig)
    r.set_defaults(func=run)
