"""`corelens report`: one self-contained HTML page from run directories."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> None:
    """Write the HTML report of the given run directories."""
    from corelens.report.html import write_report

    path = write_report(args.runs, args.out, title=args.title)
    print(f"wrote {path}")


def register(sub) -> None:
    """Add the `report` parser."""
    r = sub.add_parser("report", help="one self-contained HTML page for a study")
    r.add_argument("runs", nargs="+", help="run directories (rank, stability, ablate, hybrid, flow, sap)")
    r.add_argument("--out", required=True, help="HTML file to write")
    r.add_argument("--title", default="corelens report")
    r.set_defaults(func=run)
