"""`corelens bench WHAT ...`: performance benchmarks (each times both sides in one run).

Each benchmark module (corelens.bench.*) has `add_arguments(parser)` and `run(args)`: its options belong to
this parser, so `corelens bench WHAT --help` and a malformed value are answered like any other command's;
its `main(argv)` (`python -m corelens.bench.WHAT ...`) parses through the same parser.
"""

from __future__ import annotations

import importlib

BENCHMARKS = {
    "ram": "corelens.bench.ram",
    "flow": "corelens.bench.flow",
    "hybrid": "corelens.bench.hybrid",
    "scale": "corelens.bench.scale",
}


def register(sub) -> None:
    """Add the `bench` parser and one sub-parser per benchmark."""
    b = sub.add_parser("bench", help="performance benchmarks (see benchmarks/)")
    what = b.add_subparsers(dest="what", required=True, metavar="WHAT")
    for name, path in BENCHMARKS.items():
        module = importlib.import_module(path)
        summary = module.__doc__.splitlines()[0]
        w = what.add_parser(name, help=summary, description=summary)
        module.add_arguments(w)
        w.set_defaults(func=module.run)
