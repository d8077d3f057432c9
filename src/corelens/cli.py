"""Command line: argument parsing only; each command (corelens.commands.*) calls one experiment."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from corelens.commands import COMMANDS
from corelens.errors import CorelensError


def parser() -> argparse.ArgumentParser:
    """Return the corelens argument parser with every command registered."""
    p = argparse.ArgumentParser(prog="corelens", description="Find, test and exploit visual retrieval heads.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"corelens.commands.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the corelens command line; return the exit code."""
    args = parser().parse_args(argv)
    try:
        if isinstance(getattr(args, "data", None), str) and args.command != "organism":
            from corelens.data.readers import resolve

            args.data = str(resolve(args.data))  # NAME:PATH -> converted (cached) sample file
        args.func(args)
    except CorelensError as err:
        if args.debug:
            traceback.print_exc()
        from corelens.runs.dist import launched

        # Under torchrun every rank prints its own error: say which rank met it.
        where = (
            f"[rank {os.environ.get('RANK', '?')} of {os.environ.get('WORLD_SIZE')}] " if launched() else ""
        )
        print(f"corelens: error: {where}{err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
