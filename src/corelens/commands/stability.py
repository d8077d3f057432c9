"""`corelens stability`: compare rank runs of different tasks or models (Spearman, Jaccard, universal heads)."""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> None:
    """Compare rank runs and write the stability run directory."""
    from corelens.experiments.stability import stability

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
    s.add_argument("runs", nargs="+", help="rank run directories (two or more)")
    s.add_argument("--out", required=True, help="run directory to write")
    s.add_argument("--k", default="5%", help="top-k for Jaccard / universal heads / depth: a count or N%%")
    s.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the Spearman intervals")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=run)
