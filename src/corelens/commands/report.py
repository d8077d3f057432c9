"""`corelens report`: one self-contained HTML page from run directories, or served on localhost (`--serve`).

`--serve` answers only the files the report consists of (the page and the explorer's data file it references,
read once when the server starts), and only to a request whose `Host` is the loopback address it bound
(127.0.0.1, localhost or [::1] with its port): no folder listing, no other file, no path a browser could be
led to by DNS rebinding. It refuses to start when one of those files is not a plain file in the report's own
folder (a symlink, or a file elsewhere), which a page written by `corelens report` never is.
"""

from __future__ import annotations

import argparse
import http.server
import mimetypes
import os
import stat
import sys
import urllib.parse
from http import HTTPStatus
from pathlib import Path

from corelens.commands.argtypes import existing_path, output_path, port
from corelens.errors import CorelensError


class _Server(http.server.ThreadingHTTPServer):
    files: dict[str, tuple[bytes, str]] = {}  # "/name" -> (content, Content-Type)
    hosts: frozenset[str] = frozenset()  # the Host header values a request may carry

    def handle_error(self, request, client_address) -> None:
        # One failed request (a browser that went away mid-transfer, say) is one line, not a traceback, and the
        # server goes on serving.
        host, port = client_address[:2]
        print(f"corelens: request from {host}:{port} failed: {sys.exc_info()[1]!r}", file=sys.stderr)


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET / HEAD of the report's own files; 421 to a foreign Host, 403 to another site's page, else 404."""

    server: _Server

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if (self.headers.get("Host") or "").lower() not in self.server.hosts:
            # DNS rebinding: a name of the attacker's that now resolves to 127.0.0.1 reaches the socket, not the
            # report; a request with no Host at all is refused the same way.
            return self.send_error(HTTPStatus.MISDIRECTED_REQUEST, "not a host this server answers to")
        if self.headers.get("Sec-Fetch-Site", "none") not in ("same-origin", "none"):
            # Another site's page including the explorer's data file as a script would read the report's data.
            return self.send_error(HTTPStatus.FORBIDDEN, "requested from another site")
        name = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if name not in self.server.files:  # no listing, no sibling, no `..`: only the exact names
            return self.send_error(HTTPStatus.NOT_FOUND)
        content, kind = self.server.files[name]
        self.send_response(HTTPStatus.OK)
        for header, value in (
            ("Content-Type", kind),
            ("Content-Length", str(len(content))),
            ("X-Content-Type-Options", "nosniff"),
            ("Cross-Origin-Resource-Policy", "same-origin"),
            ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-store"),
        ):
            self.send_header(header, value)
        self.end_headers()
        if body:
            self.wfile.write(content)


def _read(path: Path, folder: Path) -> bytes:
    """Return the bytes of `path`, a plain file directly in `folder`; refuse a symlink or a file elsewhere."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # a symlink fails here (ELOOP)
    except OSError as error:
        raise CorelensError(
            f"--serve refuses to serve {path}: {error.strerror}; it serves only plain files of the report's "
            f"own folder {folder} (not a symlink)"
        ) from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or path.parent.resolve() != folder:
            # A folder, a device or a file outside the report's folder: serving it would expose it.
            raise CorelensError(
                f"--serve refuses to serve {path}: it serves only plain files of the report's own folder {folder}"
            )
        return file.read()


def served_files(files: list[Path]) -> dict[str, tuple[bytes, str]]:
    """Return what the server answers: "/name" -> (content, type) of the report `files[0]` and its files."""
    folder = files[0].parent.resolve()
    served = {}
    for path in files:
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        kind += "; charset=utf-8" if kind.startswith("text/") else ""
        served["/" + path.name] = (_read(path, folder), kind)
    return served


def make_server(files: list[Path], port: int) -> _Server:
    """Return a server of `files` (the report first) bound to 127.0.0.1:`port` (0: any free port)."""
    served = served_files(files)
    try:
        server = _Server(("127.0.0.1", port), _Handler)
    except OSError as error:  # the port is taken or not ours to bind
        raise CorelensError(f"cannot serve on 127.0.0.1:{port}: {error.strerror or error}") from None
    bound = server.server_address[1]
    names = ("127.0.0.1", "localhost", "[::1]")
    # A browser leaves out the default port 80 from Host.
    server.hosts = frozenset({f"{n}:{bound}" for n in names} | (set(names) if bound == 80 else set()))
    server.files = served
    return server


def serve(files: list[Path], port: int) -> None:
    """Serve the report `files[0]` and the files it references on 127.0.0.1:`port` until Ctrl-C."""
    server = make_server(files, port)
    with server:
        print(
            f"serving http://127.0.0.1:{server.server_address[1]}/{files[0].name} (Ctrl-C stops)", flush=True
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:  # the user's way to stop: no traceback
            print("stopped")


def run_folders(paths: list[str]) -> list[Path]:
    """Return each path that is a run folder (it holds manifest.json) as given, and for a folder of run folders
    (the demo's `runs/demo`) the run folders directly inside it, in the order they were started."""
    from corelens.runs.rundir import MANIFEST, read_manifest

    found: list[Path] = []
    for path in map(Path, paths):
        if (path / MANIFEST).is_file():
            found.append(path)
            continue
        inside = [p for p in sorted(path.iterdir()) if (p / MANIFEST).is_file()] if path.is_dir() else []
        if not inside:
            raise CorelensError(f"{path}: not a run folder (no {MANIFEST}) and holds no run folder")
        # The order they ran in: the demo's ranks, then its sweeps, then its stability, as its own report.
        found += sorted(inside, key=lambda p: str(read_manifest(p / MANIFEST).get("started") or ""))
    return found


def run(args: argparse.Namespace) -> None:
    """Write the HTML report of the given run directories; with --serve, serve it on localhost."""
    from corelens.report.html import write_report_files

    if args.out is None and len(args.runs) > 1:
        raise CorelensError("report of several folders: --out FILE.html names the page to write")
    out = args.out or Path(args.runs[0]) / "report.html"  # one folder: the page beside its runs
    files = write_report_files(run_folders(args.runs), out, title=args.title, inline=not args.serve)
    extra = "".join(f" + {f.stat().st_size / 1e6:.1f} MB of explorer data in {f.name}" for f in files[1:])
    print(f"wrote {files[0]} ({files[0].stat().st_size / 1e6:.1f} MB{extra})")
    if args.serve:
        serve(files, args.port)


def register(sub) -> None:
    """Add the `report` parser."""
    r = sub.add_parser("report", help="one self-contained HTML page for a study")
    r.add_argument(
        "runs",
        nargs="+",
        type=existing_path,
        help="run folders (rank, stability, ablate, hybrid, flow, sap), or folders of run folders such as the "
        "demo's runs/demo",
    )
    r.add_argument(
        "--out",
        type=output_path,
        default=None,
        help="HTML file to write (default: report.html inside the one folder given)",
    )
    r.add_argument("--title", default="corelens report", help="the page's title")
    r.add_argument(
        "--serve",
        action="store_true",
        help="keep the explorer's data in a file beside the page and serve both (nothing else) on localhost "
        "until Ctrl-C",
    )
    r.add_argument("--port", type=port, default=8000, help="port of --serve, 0 to 65535 (0: any free port)")
    r.set_defaults(func=run)
