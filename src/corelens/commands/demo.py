"""`corelens demo`: the main job on the bundled default model."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> None:
    """Run the demo."""
    from corelens.experiments.demo import run_demo

    run_demo(args.out, model=args.model, n=args.n)


def register(sub) -> None:
    """Add the `demo` parser."""
    d = sub.add_parser("demo", help="the main job on the bundled default model")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--model", default=None, help="use this checkpoint instead of the default")
    d.add_argument("--n", type=int, default=8, help="samples per task")
    d.set_defaults(func=run)
