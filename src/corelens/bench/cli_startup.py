"""How long the command line takes to answer without running a command: `corelens --help`, `--version`, and for
every command an argument error (`corelens ablate --bogus`) and its `--help`, against the interpreter's own
start (`python -c pass`).

Each case runs `--repeats` times in a fresh process; the table shows the median in ms and as a ratio to the
bare interpreter. The command line imports a command's module when that command is parsed, and torch or
transformers only when it runs (`corelens.choices` holds the values its options choose from), so every case
should answer well under a second on any machine; tests/test_cli_startup.py checks the imports, not the times.

    python benchmarks/cli_startup.py [--repeats 5] [--commands rank,ablate]

(that script passes the source tree's `corelens.commands.COMMANDS` to `main`: the commands' layer is above
this one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]  # the source tree holding this corelens, put first for the children

TOP = {
    "python -c pass": ["-c", "pass"],
    "corelens --help": ["-m", "corelens", "--help"],
    "corelens --version": ["-m", "corelens", "--version"],
}


def seconds(argv: list[str], env: dict[str, str]) -> float:
    """Return the wall time of one fresh `python ARGV` (its output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def median(argv: list[str], env: dict[str, str], repeats: int) -> float:
    return statistics.median(seconds(argv, env) for _ in range(repeats))


def main(commands: tuple[str, ...]) -> None:
    """Parse the options (`--commands` defaults to `commands`), time every case and print the tables."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per case (the median is shown)")
    p.add_argument("--commands", default=",".join(commands), help="comma-separated commands to time")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    top = {name: median(argv, env, args.repeats) for name, argv in TOP.items()}
    bare = top["python -c pass"]
    print(f"{'case':24s} {'median ms':>10s} {'x python':>9s}  ({args.repeats} runs, {os.cpu_count()} cores)")
    for name, value in top.items():
        print(f"{name:24s} {value * 1e3:10.0f} {value / bare:9.1f}")
    print(f"\n{'command':12s} {'--bogus ms':>11s} {'--help ms':>10s} {'slowest x python':>17s}")
    for command in (c.strip() for c in args.commands.split(",") if c.strip()):
        bogus = median(["-m", "corelens", command, "--bogus"], env, args.repeats)
        helped = median(["-m", "corelens", command, "--help"], env, args.repeats)
        print(f"{command:12s} {bogus * 1e3:11.0f} {helped * 1e3:10.0f} {max(bogus, helped) / bare:17.1f}")
