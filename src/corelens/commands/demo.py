"""`corelens demo`: the main job on the bundled default model."""

from __future__ import annotations

import argparse

from corelens.commands.argtypes import output_path, positive
from corelens.commands.common import add_model_options, load_options


def run(args: argparse.Namespace) -> None:
    """Run the demo."""
    print(
        "corelens demo: loading torch, transformers and the bundled model", flush=True
    )  # seconds of imports
    from corelens.experiments.demo import run_demo

    run_demo(args.out, model=args.model, n=args.n, eval_n=args.eval_n, load_options=load_options(args))


def register(sub) -> None:
    """Add the `demo` parser."""
    d = sub.add_parser("demo", help="the main job on the bundled default model")
    d.add_argument(
        "--out", type=output_path, default="runs/demo", help="folder of the demo's runs and report.html"
    )
    add_model_options(d, required=False)
    d.set_defaults(model=None)
    # The defaults are corelens.experiments.demo's RANK_N and EVAL_N, written out here so that parsing the
    # command line imports no experiment (and so no torch); tests/test_demo.py checks they agree.
    d.add_argument("--n", type=positive, default=32, help="samples ranked per task")
    d.add_argument(
        "--eval-n", type=positive, default=16, help="samples evaluated per condition (ablation, hybrid)"
    )
    d.set_defaults(func=run)
