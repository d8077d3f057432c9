"""`corelens ablate`: ablate head sets from a rank run and measure accuracy (dose-response)."""

from __future__ import annotations

import argparse
import sys

from corelens.choices import KEY_SETS, OPS, OPTIONAL, SCORERS, SETS
from corelens.commands.argtypes import k_list, names_of, output_path, samples_path
from corelens.commands.common import (
    add_draw_options,
    add_granularity,
    add_limit_options,
    add_model_options,
    add_random_from,
    add_resample_options,
    add_run_options,
    limits_of,
    load_options,
    main_process,
    print_resampled,
)


def run(args: argparse.Namespace) -> None:
    """Run an ablation sweep into a run directory and print its summary."""
    from corelens.experiments.ablate import sweep_path
    from corelens.heads import resolve_heads

    result = sweep_path(
        args.model,
        args.data,
        resolve_heads(args.heads),
        args.out,
        ks=args.k,
        sets=[s.strip() for s in args.sets.split(",") if s.strip()],
        op=args.op,
        keys=args.keys,
        seeds=args.seeds,
        control_width=args.control_width,
        max_draws=args.max_draws,
        seed=args.seed,
        random_from=args.random_from,
        reference=args.reference,
        scorer=args.scorer,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        skip_bad=args.skip_bad,
        limits=limits_of(args),
        rank_resamples=args.rank_resamples,
        stable_p=args.stable_p,
        granularity=args.granularity,
        progress=True,
        argv=sys.argv,
        load_options=load_options(args),
    )
    if not main_process():
        return
    summary = result.summary.copy()
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print_resampled(result, args.rank_resamples)
    extra = ", resampled.csv" if result.resampled is not None else ""
    print(
        f"wrote {args.out}/ablation.csv, ablation_summary.csv{extra}, records.parquet, figures/dose_response.png"
    )


def register(sub) -> None:
    """Add the `ablate` parser."""
    a = sub.add_parser("ablate", help="ablate top / bottom / random head sets and measure accuracy")
    add_model_options(a)
    a.add_argument(
        "--data", type=samples_path, required=True, help="samples to evaluate on (JSONL, with answers)"
    )
    a.add_argument(
        "--heads",
        required=True,
        help="heads.csv of a rank run, an exported head-set folder or its hub id (found on other data)",
    )
    a.add_argument("--out", type=output_path, required=True, help="run directory (resumed if it exists)")
    a.add_argument(
        "--k", type=k_list, default="1%,2%,5%,10%", help="set sizes: counts or shares, e.g. 1%%,5%% or 4,8"
    )
    a.add_argument(
        "--sets",
        type=names_of(SETS + OPTIONAL, "head set"),
        default=",".join(SETS),
        help=f"comma-separated, of {', '.join(SETS + OPTIONAL)} (stable: heads with P(top-k) >= --stable-p)",
    )
    add_resample_options(a, "ablate")
    add_granularity(a, "ablated")
    a.add_argument("--op", choices=OPS, default="zero", help="operator: docs/methods.md#interventions")
    a.add_argument("--keys", choices=KEY_SETS, default="visual", help="knockout key set")
    add_draw_options(a, "each random / layer-matched set")
    a.add_argument("--seed", type=int, default=0, help="base seed of the random draws")
    add_random_from(a)
    a.add_argument(
        "--reference",
        type=samples_path,
        default=None,
        help="op mean: reference samples (default: the rank run's data)",
    )
    a.add_argument(
        "--scorer",
        choices=SCORERS,
        default="auto",
        help="how an answer is scored: exact match, a choice letter, yes/no; auto picks by the gold answer",
    )
    a.add_argument("--max-new-tokens", type=int, default=8, help="greedy answer length in tokens")
    a.add_argument("--limit", type=int, default=None, help="use the first N good samples")
    a.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    add_run_options(a)
    add_limit_options(a)
    a.set_defaults(func=run)
