"""`corelens organism train|eval`: train the bundled model organism from scratch, or evaluate one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from corelens.commands.argtypes import existing_path, output_path
from corelens.commands.shared import add_model_options, load_options


def run_train(args: argparse.Namespace) -> None:
    """Train an organism from scratch into `--out`."""
    from corelens.organism.architecture import OrganismConfig
    from corelens.organism.train import TrainConfig, train
    from corelens.runs.fields import from_mapping

    # --steps, --batch, --turns, --lr, --seed, --threads and --time-limit are named like their fields.
    sizes = OrganismConfig.sized(layers=args.layers, heads=args.heads, hidden=args.hidden)
    cfg = from_mapping(TrainConfig, {**vars(args), "model": sizes})
    train(args.out, cfg, argv=["corelens", *sys.argv[1:]] if args.record_argv else None)


def run_eval(args: argparse.Namespace) -> None:
    """Evaluate an organism on held-out samples and print / write the per-task table."""
    from corelens.experiments.organism_eval import evaluate_organism
    from corelens.organism import organism_path

    model = args.model or organism_path()
    result = evaluate_organism(
        model,
        n=args.n,
        seed=args.seed,
        data=args.data,
        baseline_train=args.baseline_train,
        progress=args.progress,
        load_options=load_options(args),
    )
    print(f"model: {result['model']}  (seed {result['seed']}, {result['n_per_task']} samples per task)")
    print(f"{'task':10s} {'accuracy':>9s} {'blank':>7s} {'chance':>7s} {'text-only':>10s} {'n':>5s}")
    for task, row in result["tasks"].items():
        print(
            f"{task:10s} {row['accuracy']:9.3f} {row['blank_accuracy']:7.3f} {row['chance']:7.3f} "
            f"{row['text_only_accuracy']:10.3f} {row['n']:5d}"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


def run_card(args: argparse.Namespace) -> None:
    """Evaluate the reference sample and write reference.json + CARD.md into the checkpoint folder."""
    from corelens.experiments.organism_card import write_card, write_reference

    evaluation = json.loads(Path(args.eval).read_text())
    reference = write_reference(args.model, args.model)
    ram = {"text": Path(args.ram_text).read_text()} if args.ram_text else None
    print(f"reference sample (seed {reference['seed']}, n {reference['n']}): {reference['tasks']}")
    print(f"wrote {write_card(args.model, evaluation, reference, ram)}")


def register(sub) -> None:
    """Add the `organism` parser with its `train` and `eval` sub-commands."""
    from corelens.organism.config import OrganismConfig, TrainConfig

    o = sub.add_parser("organism", help="train or evaluate the bundled model organism")
    actions = o.add_subparsers(dest="action", required=True)
    defaults, sizes = TrainConfig(), OrganismConfig()
    t = actions.add_parser("train", help="train an organism from scratch on the CPU")
    t.add_argument("--out", type=output_path, required=True, help="checkpoint folder to write")
    t.add_argument("--steps", type=int, default=defaults.steps, help="optimiser steps")
    t.add_argument("--batch", type=int, default=defaults.batch, help="scenes per step")
    t.add_argument("--turns", type=int, default=defaults.turns, help="questions per scene (chat turns)")
    t.add_argument("--lr", type=float, default=defaults.lr, help="learning rate")
    t.add_argument("--seed", type=int, default=defaults.seed, help="weight initialisation seed")
    t.add_argument("--threads", type=int, default=defaults.threads, help="CPU threads of torch")
    t.add_argument("--time-limit", type=float, default=0.0, help="stop after this many seconds (0: none)")
    t.add_argument("--layers", type=int, default=sizes.layers, help="decoder layers")
    t.add_argument("--heads", type=int, default=sizes.heads, help="attention heads per layer")
    t.add_argument("--hidden", type=int, default=sizes.hidden, help="hidden size")
    t.add_argument("--no-record-argv", dest="record_argv", action="store_false", help=argparse.SUPPRESS)
    t.set_defaults(func=run_train)
    e = actions.add_parser("eval", help="evaluate an organism on held-out samples")
    add_model_options(e, required=False)
    e.add_argument("--n", type=int, default=200, help="samples per task")
    e.add_argument("--seed", type=int, default=1, help="sample seed (training uses 0)")
    e.add_argument("--json", type=output_path, default=None, help="write the results here")
    e.add_argument("--data", type=output_path, default=None, help="keep the generated samples in this folder")
    e.add_argument(
        "--baseline-train", type=int, default=600, help="training samples for the text-only baseline"
    )
    e.add_argument("--progress", action="store_true", help="show a progress bar")
    e.set_defaults(func=run_eval)
    c = actions.add_parser("card", help="write reference.json and CARD.md into a trained checkpoint folder")
    c.add_argument(
        "--model", type=existing_path, required=True, help="checkpoint folder written by `organism train`"
    )
    c.add_argument("--eval", type=existing_path, required=True, help="JSON written by `organism eval --json`")
    c.add_argument(
        "--ram-text", type=existing_path, default=None, help="markdown paragraph on what RAM finds (optional)"
    )
    c.set_defaults(func=run_card)
