"""`corelens rank`: rank heads by Retrieval Attention Mass."""

from __future__ import annotations

import argparse
import sys

from corelens.choices import DEFAULT_RULE, GRANULARITIES, RULES
from corelens.commands.argtypes import k_list, output_path, samples_path
from corelens.commands.common import (
    add_limit_options,
    add_model_options,
    add_run_options,
    limits_of,
    load_options,
    main_process,
)


def run(args: argparse.Namespace) -> None:
    """Rank the heads of a checkpoint on a sample file into a run directory."""
    from corelens.experiments.omega import OmegaSettings
    from corelens.experiments.rank import rank_path

    omega = None
    if args.omega == "causal":
        omega = OmegaSettings(
            args.estimator, args.omega_grid, args.omega_refine, args.omega_ratio, args.omega_batch
        )

    ranking = rank_path(
        args.model,
        args.data,
        args.out,
        query=args.query,
        rule=args.rule,
        padding=args.padding,
        limit=args.limit,
        skip_bad=args.skip_bad,
        limits=limits_of(args),
        progress=True,
        overlays=args.overlays,
        explorer=args.explorer,
        ks=args.k,
        n_boot=args.n_boot,
        boot_seed=args.seed,
        argv=sys.argv,
        load_options=load_options(args),
        omega=omega,
        granularity=args.granularity,
        kv_rule=args.kv_rule,
    )
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
    """Add the `rank` parser."""
    r = sub.add_parser("rank", help="rank heads by Retrieval Attention Mass")
    add_model_options(r)
    r.add_argument("--data", type=samples_path, required=True, help="samples (JSONL)")
    r.add_argument("--out", type=output_path, required=True, help="run directory (resumed if it exists)")
    r.add_argument(
        "--query",
        choices=("question", "last", "answer"),
        default="question",
        help="attention rows measured: the question's tokens, the last prompt token, or the answer's",
    )
    r.add_argument("--rule", choices=("any", "centre", "coverage"), default="any", help="box -> token rule")
    r.add_argument(
        "--padding",
        choices=("visual", "omega", "none"),
        default="visual",
        help="cells that hold only padding: in V not Omega (visual), in both (omega), in neither (none)",
    )
    r.add_argument(
        "--omega",
        choices=("targets", "causal"),
        default="targets",
        help="Omega from the samples' targets, or estimated from the model (no annotation needed)",
    )
    r.add_argument("--estimator", choices=("occlusion", "gradient"), default="occlusion", help="causal Omega")
    r.add_argument("--omega-grid", type=int, default=4, help="occlusion: coarse blocks per segment side")
    r.add_argument("--omega-refine", type=int, default=2, help="occlusion: coarse blocks refined per cell")
    r.add_argument("--omega-ratio", type=float, default=0.5, help="keep cells scoring >= ratio x the best")
    r.add_argument("--omega-batch", type=int, default=8, help="occlusion: occluded copies per forward")
    r.add_argument("--limit", type=int, default=None, help="use the first N good samples")
    r.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    add_run_options(r)
    add_limit_options(r)
    r.add_argument(
        "--overlays", type=int, default=2, help="draw top/bottom heads' attention on the first N samples"
    )
    r.add_argument(
        "--explorer",
        type=int,
        default=0,
        help="store quantised per-head attention maps of the first N samples for the report's head explorer (0, the default: none; the demo stores 200: each costs one more forward pass, on rank 0)",
    )
    r.add_argument(
        "--k",
        type=k_list,
        default="1%,5%,10%",
        help="top-k sizes for the bootstrap P(top-k) columns of heads.csv: counts or shares, e.g. 1%%,5%% or 8",
    )
    r.add_argument(
        "--granularity",
        choices=GRANULARITIES,
        default="query",
        help="rank query heads, or KV heads scored from their query heads (heads.csv then lists KV heads "
        "and --k counts them; docs/methods.md#kv-heads)",
    )
    r.add_argument(
        "--kv-rule",
        choices=RULES,
        default=DEFAULT_RULE,
        help="--granularity kv: a KV head's score from its query heads' RAM: sum (default, as SparseMM), "
        "mean (same ranking) or max (the best member per sample)",
    )
    r.add_argument(
        "--n-boot",
        type=int,
        default=1000,
        help="posterior draws of the head means for the intervals and P(top-k) in heads.csv",
    )
    r.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resamples")
    r.set_defaults(func=run)
