"""`corelens rank`: rank heads by Retrieval Attention Mass."""

from __future__ import annotations

from corelens.commands.options import experiment_command


def show(ranking, config) -> None:
    """Print the top heads and those whose top-k membership is uncertain."""
    unit = "KV" if ranking.granularity == "kv" else "H"
    best = ", ".join(f"L{layer}{unit}{head}" for layer, head in ranking.top(5))
    what = f"KV heads ({config.kv_rule} of their query heads' RAM)" if unit == "KV" else "heads"
    print(f"ranked {ranking.ram['sample_id'].nunique()} samples; top {what}: {best}")
    for column in [c for c in ranking.heads.columns if c.startswith("p_top")]:
        edge = ranking.heads[(ranking.heads[column] > 0.2) & (ranking.heads[column] < 0.8)]
        rows = edge[["layer", "head", column]].to_numpy()
        names = ", ".join(f"L{int(layer)}{unit}{int(head)} ({p:.2f})" for layer, head, p in rows) or "none"
        print(f"top-{column.removeprefix('p_top')} membership uncertain (0.2 < P < 0.8): {names}")
    print(f"wrote {config.out}/heads.csv, ram.parquet, manifest.json, figures/heads_mass.png")


CONFIG, ENTRY = "corelens.experiments.configs:RankConfig", "corelens.experiments.rank:run_command"
run, register = experiment_command("rank", "rank heads by Retrieval Attention Mass", CONFIG, ENTRY, show)
