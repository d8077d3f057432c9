"""Command line: argument parsing only; each command calls one experiment."""

from __future__ import annotations

import argparse
import sys
import traceback

from corelens.errors import CorelensError


def _rank(args: argparse.Namespace) -> None:
    from corelens.experiments.rank import rank_path

    ranking = rank_path(
        args.model,
        args.data,
        args.out,
        query=args.query,
        rule=args.rule,
        limit=args.limit,
        skip_bad=args.skip_bad,
        progress=True,
        argv=sys.argv,
    )
    best = ", ".join(f"L{layer}H{head}" for layer, head in ranking.top(5))
    print(f"ranked {ranking.ram['sample_id'].nunique()} samples; top heads: {best}")
    print(f"wrote {args.out}/heads.csv, ram.parquet, manifest.json, figures/heads_mass.png")


def _bench(args: argparse.Namespace) -> None:
    if args.what == "ram":
        from corelens.bench.ram import main as bench_ram

        bench_ram(args.rest)


def _demo(args: argparse.Namespace) -> None:
    from corelens.experiments.demo import run_demo

    run_demo(args.out, model=args.model, n=args.n)


def parser() -> argparse.ArgumentParser:
    """Return the corelens argument parser."""
    p = argparse.ArgumentParser(prog="corelens", description=__doc__)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("rank", help="rank heads by Retrieval Attention Mass")
    r.add_argument("--model", required=True, help="local checkpoint folder")
    r.add_argument("--data", required=True, help="samples (JSONL)")
    r.add_argument("--out", required=True, help="run directory (resumed if it exists)")
    r.add_argument("--query", choices=("question", "last", "answer"), default="question")
    r.add_argument("--rule", choices=("any", "centre", "coverage"), default="any", help="box -> token rule")
    r.add_argument("--limit", type=int, default=None, help="use the first N good samples")
    r.add_argument("--skip-bad", action="store_true", help="log and skip bad samples instead of stopping")
    r.set_defaults(func=_rank)

    b = sub.add_parser("bench", help="performance benchmarks (see benchmarks/)")
    b.add_argument("what", choices=("ram",))
    b.add_argument("rest", nargs=argparse.REMAINDER, help="options of the benchmark, e.g. --tokens 8192")
    b.set_defaults(func=_bench)

    d = sub.add_parser("demo", help="the main job on the bundled default model")
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--model", default=None, help="use this checkpoint instead of the default")
    d.add_argument("--n", type=int, default=8, help="samples per task")
    d.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the corelens command line; return the exit code."""
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except CorelensError as err:
        if args.debug:
            traceback.print_exc()
        print(f"corelens: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
