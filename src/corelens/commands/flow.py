"""`corelens flow`: residual-stream geometry (RID, MixIG) of every decoder module, with baselines."""

from __future__ import annotations

import argparse
import sys

from corelens.choices import BASELINES, DEFAULT_ALPHA, POSITION_SETS, REFERENCES, ROPE_ON
from corelens.commands.argtypes import output_path, samples_path
from corelens.commands.common import (
    add_limit_options,
    add_model_options,
    add_run_options,
    limits_of,
    load_options,
    main_process,
)


def run(args: argparse.Namespace) -> None:
    """Measure RID / MixIG per sample, layer and module into a run directory; print the Table-1 analogue."""
    from corelens.experiments.flow import FlowOptions, flow_path
    from corelens.metrics.spectra import FP32_EPS

    options = FlowOptions(
        reference=args.reference,
        positions=args.positions,
        rank=args.rank,
        eps=args.rank_eps if args.rank_eps is not None else FP32_EPS,
        energy=args.energy,
        tme_rows=args.tme_rows,
        alpha=args.alpha,
        mixig_of=args.mixig_of,
        rope=not args.no_rope,
        rope_on=args.rope_on,
        seed=args.seed,
    )
    result = flow_path(
        args.model,
        args.data,
        args.out,
        baselines=tuple(args.baseline or BASELINES),
        options=options,
        limit=args.limit,
        skip_bad=args.skip_bad,
        limits=limits_of(args),
        progress=True,
        argv=sys.argv,
        load_options=load_options(args),
    )
    if not main_process():
        return
    cols = ["row", "samples", "rid", "dS", "dD", "mixig", "paper_rid", "paper_mixig"]
    print(result.table[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {args.out}/flow.parquet, table1.csv, layers.csv, manifest.json, figures/flow_layers.png")


def register(sub) -> None:
    """Add the `flow` parser."""
    f = sub.add_parser("flow", help="RID / MixIG of every attention and FFN module: docs/methods.md#geometry")
    add_model_options(f)
    f.add_argument("--data", type=samples_path, required=True, help="samples (JSONL)")
    f.add_argument("--out", type=output_path, required=True, help="run directory (resumed if it exists)")
    f.add_argument(
        "--baseline",
        action="append",
        choices=BASELINES,
        help="repeat to run several; default: all three (fills every row of Table 1)",
    )
    f.add_argument("--reference", choices=REFERENCES, default="module", help="'layer': FFN vs layer input")
    f.add_argument("--positions", choices=POSITION_SETS, default="all", help="prompt positions measured")
    f.add_argument(
        "--rank", choices=("numerical", "energy"), default="numerical", help="kept directions of X"
    )
    f.add_argument("--rank-eps", type=float, default=None, help="epsilon of the rank threshold (fp32's)")
    f.add_argument("--energy", type=float, default=0.99, help="share of Σσ² kept by --rank energy")
    f.add_argument(
        "--tme-rows",
        choices=("mean", "last"),
        default="mean",
        help="TME of the mean over the rows, or of the last row only",
    )
    f.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help="TME sharpening exponent (1: the unsharpened W; authors' code: 8)",
    )
    f.add_argument(
        "--mixig-of",
        choices=("output", "delta"),
        default="output",
        help="MixIG's TME of the module's output X', or of its update ΔX",
    )
    f.add_argument("--no-rope", action="store_true", help="skip the ε_RoPE measurement")
    f.add_argument(
        "--rope-on",
        choices=ROPE_ON,
        default="delta",
        help="ε_RoPE between attention outputs Δ (default) or residual states X + Δ",
    )
    f.add_argument("--seed", type=int, default=0, help="seed of the noise baselines")
    f.add_argument("--limit", type=int, default=None, help="use the first N good samples")
    f.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    add_run_options(f)
    add_limit_options(f)
    f.set_defaults(func=run)
