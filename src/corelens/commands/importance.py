"""`corelens importance`: each head's single-head effect on the answer beside its RAM (docs/importance.md)."""

from __future__ import annotations

import argparse
import sys

from corelens.commands.argtypes import existing_path, output_path, positive, samples_path
from corelens.commands.common import (
    add_limit_options,
    add_model_options,
    add_run_options,
    limits_of,
    load_options,
    main_process,
)

OPS = ("zero", "knockout")  # the single-head operators attribution patching supports too
KEYS = ("visual", "omega")
ESTIMATORS = ("exact", "attribution", "both")
SCORERS = ("auto", "exact", "choice", "yesno")  # corelens.experiments.evaluate.SCORERS, without torch


def run(args: argparse.Namespace) -> None:
    """Measure importance into a run directory and print its table and the RAM-vs-causal sentence."""
    from corelens.experiments.importance import measure_path

    result = measure_path(
        args.model,
        args.data,
        args.heads,
        args.out,
        op=args.op,
        keys=args.keys,
        method=args.method,
        scorer=args.scorer,
        max_new_tokens=args.max_new_tokens,
        limit=args.limit,
        skip_bad=args.skip_bad,
        limits=limits_of(args),
        allow_same_data=args.allow_same_data,
        draws=args.draws,
        seed=args.seed,
        progress=True,
        argv=sys.argv,
        load_options=load_options(args),
    )
    if not main_process():
        return
    table = result["table"].sort_values("causal_rank")
    columns = ["layer", "head", "ram", "ram_rank", "effect", "drop_logp_low", "drop_logp_high", "drop_acc",
               "attribution", "causal_rank", "rank_diff"]  # fmt: skip
    print(table[columns].head(12).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {args.out}/importance.csv, summary.json, records.parquet, figures/ram_vs_causal.png")


def register(sub) -> None:
    """Add the `importance` parser."""
    p = sub.add_parser("importance", help="measure each head's causal effect on the answer beside its RAM")
    add_model_options(p)
    p.add_argument(
        "--data",
        type=samples_path,
        required=True,
        help="samples with answers, NOT those the heads were ranked on (refused when it is the rank run's file)",
    )
    p.add_argument(
        "--heads", type=existing_path, required=True, help="heads.csv of a rank run (its RAM and rank)"
    )
    p.add_argument("--out", type=output_path, required=True, help="run directory (resumed if it exists)")
    p.add_argument(
        "--op", choices=OPS, default="zero", help="single-head operator: docs/methods.md#interventions"
    )
    p.add_argument("--keys", choices=KEYS, default="visual", help="knockout key set")
    p.add_argument(
        "--method",
        choices=ESTIMATORS,
        default="both",
        help="exact single-head interventions, attribution patching (one forward + backward per sample), or both",
    )
    p.add_argument("--scorer", choices=SCORERS, default="auto", help="how a greedy answer is scored")
    p.add_argument("--max-new-tokens", type=positive, default=8, help="greedy answer length in tokens")
    p.add_argument("--limit", "--n", type=int, default=None, help="use the first N good samples")
    p.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    p.add_argument(
        "--allow-same-data",
        action="store_true",
        help="measure on the rank run's own data anyway (with a warning)",
    )
    p.add_argument("--draws", type=positive, default=1000, help="posterior draws behind the intervals")
    p.add_argument("--seed", type=int, default=0, help="seed of the interval draws")
    add_run_options(p)
    add_limit_options(p)
    p.set_defaults(func=run)
