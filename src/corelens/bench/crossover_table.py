"""Print and write the dense crossover of one device from its kernel tables (`corelens bench hybrid` JSON files).

Usage: `python -m corelens.bench.crossover_table RESULTS.json... --out crossover.json`. For each full-head share F it
prints the measured speed-up of the hybrid kernel over stock sdpa at each length, and the length from which the
hybrid kernel runs (`corelens.attention.kernels.crossover`); with `CORELENS_CROSSOVER=crossover.json` the
dispatcher runs every head dense below it, on that device. With `--anatomy ANATOMY.json...` (the
`corelens.bench.stream_anatomy` results of the same device) it also writes which streaming path measured faster
(`stream`: the smaller sum of ``hybrid triton`` against ``hybrid flash`` over the anatomy files), the one
`--kernel auto` then runs on that device; without it, or where an anatomy lacks either time, "triton".
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
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


def faster_stream(anatomies: list[dict], device: str) -> str:
    """Return the streaming path with the smaller total whole-kernel time over `anatomies` ("triton" if unmeasured)."""
    total = {"triton": 0.0, "flash": 0.0}
    for a in anatomies:
        if a.get("device_name") != device:
            raise InputError(
                f"crossover: an anatomy of {a.get('device_name')!r} beside kernel tables of {device!r}"
            )
        seconds = a["seconds"]
        if "hybrid triton" not in seconds or "hybrid flash" not in seconds:
            return "triton"
        for path in total:
            total[path] += float(seconds[f"hybrid {path}"])
    return "flash" if anatomies and total["flash"] < total["triton"] else "triton"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, help="also write the printed table to this file")
    parser.add_argument("--anatomy", type=Path, nargs="*", default=[], help="stream_anatomy JSON files")
    args = parser.parse_args(argv)
    try:
        results = [json.loads(p.read_text()) for p in args.results]
        crossover = Crossover.measured(results, source=", ".join(str(p) for p in args.results))
        anatomies = [json.loads(p.read_text()) for p in args.anatomy]
        crossover = replace(crossover, stream=faster_stream(anatomies, crossover.device))
    except (OSError, ValueError, KeyError, InputError) as err:
        print(f"crossover: {err}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(crossover.to_json(), indent=1) + "\n")
    text = f"crossover on {crossover.device} (speed-up of the hybrid kernel over stock sdpa, one layer):\n"
    text += table(results, crossover)
    if anatomies:
        times = "; ".join(
            f"{a['tokens']} tokens: triton {a['seconds'].get('hybrid triton', float('nan')) * 1e3:.3f} ms, "
            f"flash {a['seconds'].get('hybrid flash', float('nan')) * 1e3:.3f} ms"
            for a in anatomies
        )
        text += f"\nstreaming heads for --kernel auto: {crossover.stream} ({times})"
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    print(f"written to {args.out}; run with CORELENS_CROSSOVER={args.out} to apply it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
