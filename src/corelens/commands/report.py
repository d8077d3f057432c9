"""`corelens report`: one self-contained HTML page from run directories, or served on localhost (`--serve`)."""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
from pathlib import Path

from corelens.commands.argtypes import existing_path, output_path
from corelens.errors import CorelensError


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # One failed request (a browser that went away mid-transfer, say) is one line, not a traceback, and the
        # server goes on serving.
        host, port = client_address[:2]
        print(f"corelens: request from {host}:{port} failed: {sys.exc_info()[1]!r}", file=sys.stderr)


def serve(page: Path, port: int) -> None:
    """Serve `page`'s folder on 127.0.0.1:`port` (0: any free port) until Ctrl-C; print the page's address."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent))
    try:
        server = _Server(("127.0.0.1", port), handler)
    except OSError as error:  # the port is taken or not ours to bind
        raise CorelensError(f"cannot serve on 127.0.0.1:{port}: {error.strerror or error}") from None
    with server:
        print(f"serving http://127.0.0.1:{server.server_address[1]}/{page.name} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # the user's way to stop: no traceback
            print("stopped")


def run(args: argparse.Namespace) -> None:
    """Write the HTML report of the given run directories; with --serve, serve it on localhost."""
    from corelens.report.html import write_report

    path = write_report(args.runs, args.out, title=args.title, inline=not args.serve)
    side = path.with_name(path.stem + ".explorer.js")
    extra = f" + {side.stat().st_size / 1e6:.1f} MB of explorer data in {side.name}" if args.serve else ""
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB{extra})")
    if args.serve:
        serve(path, args.port)


def register(sub) -> None:
    """Add the `report` parser."""
    r = sub.add_parser("report", help="one self-contained HTML page for a study")
    r.add_argument(
        "runs",
        nargs="+",
        type=existing_path,
        help="run directories (rank, stability, ablate, hybrid, flow, sap)",
    )
    r.add_argument("--out", type=output_path, required=True, help="HTML file to write")
    r.add_argument("--title", default="corelens report")
    r.add_argument(
        "--serve",
        action="store_true",
        help="keep the explorer's data in a file beside the page and serve both on localhost until Ctrl-C",
    )
    r.add_argument("--port", type=int, default=8000, help="port of --serve (0: any free port)")
    r.set_defaults(func=run)
