"""Print and write the dense crossover of one device from its kernel tables (`corelens bench hybrid` JSON files).

Usage: `python -m corelens.bench.crossover_table RESULTS.json... --out crossover.json`. For each full-head share F it
prints the measured speed-up of the hybrid kernel over stock sdpa at each length, and the length from which the
hybrid kernel runs (`corelens.attention.kernels.crossover`); with `CORELENS_CROSSOVER=crossover.json` the
dispatcher runs every head dense below it, on that device.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from corelens.attention.kernels.crossover import Crossover
from corelens.errors import InputError


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def table(results: list[dict], crossover: Crossover) -> str:
    """Return the markdown table: one row per share F, speed-up per length, and the crossover length."""
    lengths = sorted({int(r["tokens"]) for r in results})
    rows = [
        "| F | " + " | ".join(_tokens(n) for n in lengths) + " | hybrid from |",
        "|---|" + "---:|" * (len(lengths) + 1),
    ]
    for f, wins in zip(crossover.shares, crossover.lengths):
        cells = []
        for n in lengths:
            speed = [
                row["speedup"]
                for r in results
                if int(r["tokens"]) == n
                for row in r["per_keep"].values()
                if abs(float(row["full_fraction"]) - f) < 1e-6
            ]
            cells.append(f"{speed[0]:.2f}x" if speed else "-")
        since = "never (dense)" if wins == float("inf") else _tokens(int(wins))
        rows.append(f"| {f:.0%} | " + " | ".join(cells) + f" | {since} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, help="also write the printed table to this file")
    args = parser.parse_args(argv)
    try:
        results = [json.loads(p.read_text()) for p in args.results]
        crossover = Crossover.measured(results, source=", ".join(str(p) for p in args.results))
    except (OSError, ValueError, KeyError, InputError) as err:
        print(f"crossover: {err}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(crossover.to_json(), indent=1) + "\n")
    text = f"crossover on {crossover.device} (speed-up of the hybrid kernel over stock sdpa, one layer):\n"
    text += table(results, crossover)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(f"written to {args.out}; run with CORELENS_CROSSOVER={args.out} to apply it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
