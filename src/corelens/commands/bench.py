"""`corelens bench WHAT ...`: performance benchmarks (each times both sides in one run)."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS = {
    "ram": "corelens.bench.ram",
    "flow": "corelens.bench.flow",
    "hybrid": "corelens.bench.hybrid",
    "scale": "corelens.bench.scale",
}


def run(args: argparse.Namespace) -> None:
    """Run one benchmark with its own options."""
    importlib.import_module(BENCHMARKS[args.what]).main(args.rest)


def register(sub) -> None:
    """Add the `bench` parser."""
    b = sub.add_parser("bench", help="performance benchmarks (see benchmarks/)")
    b.add_argument("what", choices=sorted(BENCHMARKS))
    b.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark, e.g. --tokens 8192")
    b.set_defaults(func=run)
