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
    """Run the corelens command line; return the exit code (2: a malformed command, or a CorelensError)."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as stop:  # argparse printed the usage and one error line (2), or the help (0)
        return stop.code
    from corelens.runs.dist import launched

    # Under torchrun every rank prints its own error: which rank met it, on a line of its own (rank 0's
    # progress bar may hold the terminal's current line).
    where = f"\ncorelens: error: [rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}] "
    where = where if launched() else "corelens: error: "
    try:
        if isinstance(getattr(args, "data", None), str) and args.command != "organism":
            _resolve_data(args)
        args.func(args)
    except CorelensError as err:
        if args.debug:
            traceback.print_exc()
        print(f"{where}{err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        # A rank waiting for the others (gloo) hears that one of them died: that rank printed why, and
        # torchrun ends this one too; the finished samples are in the run's logs.
        if not launched() or args.debug or not _peer_lost(err):
            raise
        print(f"{where}another rank stopped (its error is above); finished samples are "
              "kept in the run directory: run the same command again to resume", file=sys.stderr)  # fmt: skip
        return 1
    if launched():
        from corelens.runs.dist import close, current

        current().barrier()  # every rank has finished; then leave the group together
        close()
    return 0


def _peer_lost(err: RuntimeError) -> bool:
    """Return True for the error a collective raises when another rank's process has gone."""
    import torch.distributed as dist

    text = str(err)
    return isinstance(err, dist.DistError) or "gloo" in text or "Connection closed by peer" in text


def _resolve_data(args: argparse.Namespace) -> None:
    """Replace NAME:PATH by its converted (cached) sample file; under torchrun rank 0 converts first."""
    from corelens.data.readers import resolve
    from corelens.runs.dist import current

    dist = current()
    if not dist.main:
        dist.barrier()  # the others read the cache rank 0 has written
    args.data = str(resolve(args.data))
    if dist.main:
        dist.barrier()


if __name__ == "__main__":
    sys.exit(main())
