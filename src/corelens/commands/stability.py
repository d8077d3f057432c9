"""`corelens stability`: compare rank runs of different tasks or models (Spearman, Jaccard, universal heads)."""

from __future__ import annotations

import argparse
import sys

from corelens.commands.argtypes import existing_path, k_list, output_path


def curve(args: argparse.Namespace) -> None:
    """Write the stability curve of one rank run into it and print where the top-k settles."""
    from corelens.experiments.stability import CURVE, curve_of_run

    _, info = curve_of_run(args.curve, k=args.k, pairs=args.pairs, seed=args.seed, argv=sys.argv)
    half = info["samples"] // 2
    for name, n in info["first_n_at_0.9"].items():
        label = name.replace("jaccard_top", "top-") + (" Jaccard" if name != "spearman" else "")
        print(f"{label} >= 0.9 from n = {n}" if n else f"{label} < 0.9 up to n = {half} (half the samples)")
    print(f"wrote {args.curve}/{CURVE}.csv, {CURVE}.json, figures/{CURVE}.png")


def run(args: argparse.Namespace) -> None:
    """Compare rank runs and write the stability run directory (or, with --curve, one run's curve)."""
    from corelens.errors import CorelensError
    from corelens.experiments.stability import stability

    if args.curve:
        if args.runs:
            raise CorelensError("--curve takes one rank run; give no other run directories")
        return curve(args)
    if args.out is None:
        raise CorelensError("--out is required to compare rank runs")

    result = stability(args.runs, args.out, k=args.k, n_boot=args.n_boot, seed=args.seed, argv=sys.argv)
    for row in result.spearman.itertuples():
        print(f"{row.a} vs {row.b}: Spearman {row.spearman:.3f} [{row.low:.3f}, {row.high:.3f}]")
    for row in result.topology.itertuples():
        print(
            f"{row.run}: {row.heads_for_50pct:.1%} of heads hold 50 % of the mass, "
            f"{row.heads_for_80pct:.1%} hold 80 %; Gini {row.gini:.3f}"
        )
    universal = ", ".join(f"L{layer}H{head}" for layer, head in result.universal) or "none"
    print(f"universal heads (top-{args.k} of every run): {universal}")
    print(
        f"wrote {args.out}/spearman.csv, jaccard.csv, universal.csv, core_set.csv, topology.csv, depth.csv, figures/"
    )


def register(sub) -> None:
    """Add the `stability` parser."""
    s = sub.add_parser("stability", help="cross-task / cross-model stability of rank runs")
    s.add_argument("runs", nargs="*", type=existing_path, help="rank run directories (two or more)")
    s.add_argument("--out", type=output_path, default=None, help="run directory to write (not with --curve)")
    s.add_argument(
        "--curve",
        type=existing_path,
        default=None,
        metavar="RUN",
        help="write RUN's stability curve into it: top-k Jaccard and Spearman of two disjoint n-sample rankings",
    )
    s.add_argument(
        "--k",
        type=k_list,
        default="5%",
        help="top-k for Jaccard / universal heads / depth: a count or N%% (--curve: a list)",
    )
    s.add_argument("--pairs", type=int, default=200, help="--curve: random subset pairs per n")
    s.add_argument(
        "--n-boot",
        type=int,
        default=1000,
        help="posterior draws of each run's means for the Spearman intervals",
    )
    s.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and subset draws")
    s.set_defaults(func=run)
