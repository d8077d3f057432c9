"""Run directories: a manifest, a resumable per-sample log, and the tables a command writes.

Each process appends one line per finished or skipped sample to its own log, written and fsynced before the
next sample starts, so a run killed at any moment loses at most the samples in flight: `samples.jsonl` for a
single process, `samples.rank{R}.jsonl` for rank R of a torchrun launch. The run's log is the union of these
files, so a restart with the same settings, with any number of ranks, skips what any of them holds; a torn
last line (killed mid-write) is cut off. When a multi-rank run ends, rank 0 merges the shards into
`samples.jsonl`.
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
from corelens.runs.dist import Dist

LOG = "samples.jsonl"
SHARDS = "samples.rank*.jsonl"
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
    from importlib.metadata import version

    import numpy
    import torch
    import transformers

    return {
        "corelens": version("corelens"),  # pyproject.toml, as installed (= corelens.__version__)
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
    """Return the settings every run records about its model and sample file (path, hub commit, dtype, hash).

    The dtype is a setting (a bf16 run does not resume an fp32 one); the device is not, since a run may resume
    on other hardware or with another number of ranks.
    """
    return {
        "model": str(m.path.resolve()),
        "model_id": m.source.get("id"),
        "model_commit": m.source.get("commit"),
        "model_config_hash": m.config_hash(),
        "dtype": str(m.dtype).removeprefix("torch."),
        "data": str(Path(data).resolve()),
        "data_sha256": file_hash(data),
    }


def write_json(path: Path, data: object) -> None:
    """Write JSON atomically (temp file + rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


class Run:
    """A run directory; `settings` must match on resume (model, data, options), or the run refuses.

    Under torchrun every rank constructs the same `Run`: rank 0 checks and writes the manifest and repairs the
    logs, the others wait for it and then check the manifest it wrote.
    """

    def __init__(
        self,
        path: str | Path,
        command: str,
        settings: dict,
        argv: list[str] | None = None,
        dist: Dist | None = None,
        device: object = None,
    ) -> None:
        self.path = Path(path)
        self.dist = dist or Dist()
        self.command = command
        self.settings = json.loads(json.dumps(settings, default=str))
        self.log_path = self.path / (LOG if self.dist.world == 1 else f"samples.rank{self.dist.rank}.jsonl")
        # Per process, gathered into the manifest by `finish`: where it ran and what it did.
        self.stats = {"device": None if device is None else str(device), "samples": 0, "seconds": 0.0}
        manifest_path = self.path / MANIFEST
        if self.dist.main:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "figures").mkdir(exist_ok=True)
            if manifest_path.exists():
                old = json.loads(manifest_path.read_text())
                self._check(old)
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
                argv=argv if argv is not None else sys.argv,
                versions=versions(),
                machine=machine(),
                world_size=self.dist.world,
                finished=None,
            )
            write_json(manifest_path, self.manifest)
            for log in self.logs():
                _repair(log)
        self._t0 = time.perf_counter()
        self.dist.barrier()
        if not self.dist.main:
            # Every rank must see the directory rank 0 wrote: multi-node runs need --out on a shared filesystem.
            if not manifest_path.is_file():
                raise CorelensError(
                    f"{self.path}: rank {self.dist.rank} cannot see the run directory rank 0 created; "
                    "--out must be on a filesystem every node shares"
                )
            self.manifest = json.loads(manifest_path.read_text())
            self._check(self.manifest)

    def _check(self, old: dict) -> None:
        if old.get("command") != self.command or old.get("settings") != self.settings:
            changed = sorted(
                k
                for k in set(old.get("settings", {})) | set(self.settings)
                if old.get("settings", {}).get(k) != self.settings.get(k)
            )
            raise CorelensError(
                f"{self.path} holds a {old.get('command')!r} run with other settings ({', '.join(changed)}); "
                "use another --out or delete it"
            )

    def logs(self) -> list[Path]:
        """Return the log files of this run: `samples.jsonl` first, then the rank shards in rank order."""
        shards = sorted(self.path.glob(SHARDS), key=lambda p: int(p.name.split(".")[1].removeprefix("rank")))
        main = self.path / LOG
        return ([main] if main.exists() else []) + shards

    def records(self) -> Iterator[dict]:
        """Yield the logged per-sample records of every process, each id once, in log order."""
        seen: set[str] = set()
        for log in self.logs():
            with open(log) as f:
                for line in f:
                    if line.strip():
                        record = json.loads(line)
                        if record["id"] not in seen:
                            seen.add(record["id"])
                            yield record

    def done(self) -> set[str]:
        """Return the ids of the samples already logged (finished or skipped) by any process."""
        return {r["id"] for r in self.records()}

    def log(self, record: dict) -> None:
        """Append one sample's record durably to this process's log."""
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with open(self.log_path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def log_skipped(self, skipped, done: set[str]) -> None:
        """Log each bad input record (`SkippedSample`) once, keyed by its line; add the keys to `done`.

        Only rank 0 writes them (every rank read the same file), so that they are logged once.
        """
        for bad in skipped:
            key = f"<skipped line {bad.line}>"
            if key not in done:
                if self.dist.main:
                    self.log({"id": key, "status": "skipped", **bad.to_dict()})
                done.add(key)

    def finish(self, **extra: object) -> None:
        """Record the end, wall time, per-rank statistics and any summary; merge the shards (collective)."""
        seconds = round(time.perf_counter() - self._t0, 3)
        info = {"rank": self.dist.rank, "host": socket.gethostname(), "pid": os.getpid(), **self.stats}
        processes = self.dist.gather({**info, "seconds_total": seconds})
        if not self.dist.main:
            return
        self._merge()
        self.manifest.setdefault("timings", []).append(seconds)
        self.manifest.update(
            finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            processes=processes,
            world_size=self.dist.world,
            **extra,
        )
        write_json(self.path / MANIFEST, self.manifest)

    def _merge(self) -> None:
        """Fold the rank shards into `samples.jsonl` (atomically; a crash in between leaves duplicates that
        `records` drops), then remove them."""
        shards = [p for p in self.logs() if p.name != LOG]
        if not shards:
            return
        tmp = self.path / (LOG + ".tmp")
        with open(tmp, "w") as f:
            for record in self.records():
                f.write(json.dumps(record, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / LOG)
        for shard in shards:
            shard.unlink()


def _repair(log: Path) -> None:
    """Cut a torn last line (a process killed mid-write) off a log."""
    data = log.read_bytes()
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        with open(log, "r+b") as f:
            f.truncate(len(keep))
