"""How long the command line takes to answer without running a command: `corelens --help`, `--version` and an
argument error (`corelens rank --bogus`), against the interpreter's own start (`python -c pass`).

Each is run `--repeats` times in a fresh process (the median is printed, in ms, and as a ratio to the bare
interpreter). The command line imports a command's module, and torch or transformers, only when that command
runs, so these should answer well under a second on any machine.

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CASES = {
    "python -c pass": ["-c", "pass"],
    "corelens --help": ["-m", "corelens", "--help"],
    "corelens --version": ["-m", "corelens", "--version"],
    "corelens rank --bogus": ["-m", "corelens", "rank", "--bogus"],
    "corelens rank --help": ["-m", "corelens", "rank", "--help"],
}


def seconds(argv: list[str], env: dict[str, str]) -> float:
    """Return the wall time of one fresh `python ARGV` (its output discarded)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per case (the median is shown)")
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    medians = {
        name: statistics.median(seconds(argv, env) for _ in range(args.repeats))
        for name, argv in CASES.items()
    }
    bare = medians["python -c pass"]
    print(f"{'case':24s} {'median ms':>10s} {'x python':>9s}  ({args.repeats} runs, {os.cpu_count()} cores)")
    for name, value in medians.items():
        print(f"{name:24s} {value * 1e3:10.0f} {value / bare:9.1f}")


if __name__ == "__main__":
    main()
