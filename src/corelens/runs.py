"""Run directories: a manifest, a resumable per-sample log, and the tables a command writes.

`samples.jsonl` gets one line per finished or skipped sample, written and fsynced before the next sample
starts, so a run killed at any moment loses at most the sample in flight. A restarted run with the same
settings skips what the log holds; a torn last line (killed mid-write) is cut off.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from corelens.errors import CorelensError

LOG = "samples.jsonl"
MANIFEST = "manifest.json"


def file_hash(path: str | Path) -> str:
    """Return the sha256 hex digest of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    """Return the versions of corelens and the libraries whose numerics matter."""
    import numpy
    import torch
    import transformers

    from corelens import __version__

    return {
        "corelens": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def machine() -> dict[str, object]:
    """Return a short description of the machine."""
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def model_data_settings(m, data: str | Path) -> dict:
    """Return the settings every run records about its model and sample file (path, hash)."""
    return {
        "model": str(m.path.resolve()),
        "model_config_hash": m.config_hash(),
        "data": str(Path(data).resolve()),
        "data_sha256": file_hash(data),
    }


def write_json(path: Path, data: object) -> None:
    """Write JSON atomically (temp file + rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


class Run:
    """A run directory; `settings` must match on resume (model, data, options), or the run refuses."""

    def __init__(self, path: str | Path, command: str, settings: dict, argv: list[str] | None = None) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "figures").mkdir(exist_ok=True)
        self.log_path = self.path / LOG
        self.settings = json.loads(json.dumps(settings, default=str))
        manifest_path = self.path / MANIFEST
        if manifest_path.exists():
            old = json.loads(manifest_path.read_text())
            if old.get("command") != command or old.get("settings") != self.settings:
                changed = sorted(
                    k
                    for k in set(old.get("settings", {})) | set(self.settings)
                    if old.get("settings", {}).get(k) != self.settings.get(k)
                )
                raise CorelensError(
                    f"{self.path} holds a {old.get('command')!r} run with other settings ({', '.join(changed)}); "
                    "use another --out or delete it"
                )
            self.manifest = old
            self.manifest["resumed"] = self.manifest.get("resumed", 0) + 1
        else:
            self.manifest = {
                "command": command,
                "settings": self.settings,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "resumed": 0,
            }
        self.manifest.update(
            argv=argv if argv is not None else sys.argv, versions=versions(), machine=machine(), finished=None
        )
        self._t0 = time.perf_counter()
        write_json(manifest_path, self.manifest)
        self._repair_log()

    def _repair_log(self) -> None:
        if not self.log_path.exists():
            return
        data = self.log_path.read_bytes()
        keep = data[: data.rfind(b"\n") + 1]
        if len(keep) != len(data):
            with open(self.log_path, "r+b") as f:
                f.truncate(len(keep))

    def records(self) -> Iterator[dict]:
        """Yield the logged per-sample records, in the order they were written."""
        if not self.log_path.exists():
            return
        with open(self.log_path) as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)

    def done(self) -> set[str]:
        """Return the ids of the samples already logged (finished or skipped)."""
        return {r["id"] for r in self.records()}

    def log(self, record: dict) -> None:
        """Append one sample's record durably."""
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with open(self.log_path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def log_skipped(self, skipped, done: set[str]) -> None:
        """Log each bad input record (`SkippedSample`) once, keyed by its line; add the keys to `done`."""
        for bad in skipped:
            key = f"<skipped line {bad.line}>"
            if key not in done:
                self.log({"id": key, "status": "skipped", **bad.to_dict()})
                done.add(key)

    def finish(self, **extra: object) -> None:
        """Record the end time, wall time and any extra summary in the manifest."""
        self.manifest.setdefault("timings", []).append(round(time.perf_counter() - self._t0, 3))
        self.manifest.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra)
        write_json(self.path / MANIFEST, self.manifest)
