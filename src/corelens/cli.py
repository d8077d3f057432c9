"""Command line: argument parsing only; each command (corelens.commands.*) calls one experiment."""

from __future__ import annotations

import argparse
import importlib
import os
import re
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
        return _run(args, where)
    finally:
        from corelens.runs.lock import release_all

        release_all()  # the run folder's lock, also when the command failed


def _run(args: argparse.Namespace, where: str) -> int:
    """Run the parsed command; return its exit code (CorelensError: one line, 2; a lost torchrun peer: 1)."""
    from corelens.runs.dist import launched

    try:
        if isinstance(getattr(args, "data", None), str) and args.command != "organism":
            _resolve_data(args)
        if getattr(args, "repair_log", False):
            _repair_log(args)
        args.func(args)
    except CorelensError as err:
        if args.debug:
            traceback.print_exc()
        print(f"{where}{err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        # A rank waiting for the others (gloo) hears that one of them died or stopped answering; torchrun
        # ends this one too; the finished samples are in the run's logs.
        if not launched() or args.debug or not _peer_lost(err):
            raise
        print(f"{where}{_peer_message(str(err))}; finished samples are kept in the run directory: run the "
              "same command again to resume", file=sys.stderr)  # fmt: skip
        return 1
    if launched():
        from corelens.runs.dist import close, current

        current().barrier()  # every rank has finished; then leave the group together
        close()
    return 0


def _peer_lost(err: RuntimeError) -> bool:
    """Return True for the error a collective raises when another rank's process has gone or stopped answering."""
    import torch.distributed as dist

    text = str(err)
    lost = ("gloo", "Connection closed by peer", "monitoredBarrier", "Timed out", "timed out")
    return isinstance(err, dist.DistError) or any(sign in text for sign in lost)


def _peer_message(text: str) -> str:
    """Say which rank was lost, when the collective's error names it (gloo's monitored barrier does)."""
    from corelens.runs.dist import TIMEOUT_ENV, timeout

    limit = f"within {timeout().total_seconds():g} s ({TIMEOUT_ENV})"
    if found := re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text):
        ranks = ", ".join(r.strip() for r in found.group(1).split(",") if r.strip())
        return f"rank {ranks} did not answer {limit}"
    if found := re.search(r"from rank (\d+)", text):
        # This rank reached the barrier; the rank it waited for ended or stopped answering.
        return f"rank {found.group(1)} ended or did not answer {limit}"
    if "Timed out" in text or "timed out" in text:
        return f"a rank did not answer {limit}"
    # The connection to another rank closed: its process ended (an error it met is printed above, if any).
    return "another rank's process ended"


def _repair_log(args: argparse.Namespace) -> None:
    """--repair-log: drop the damaged lines of the run's logs (rank 0, before the others read them)."""
    from corelens.runs.dist import current
    from corelens.runs.rundir import repair_logs

    dist = current()
    if dist.main:
        repair_logs(args.out)
    dist.barrier()


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
