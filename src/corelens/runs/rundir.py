"""Run directories: a manifest, a resumable per-sample log, and the tables a command writes.

Each process appends one line per finished or skipped sample to its own log, written and fsynced before the
next sample starts, so a run killed at any moment loses at most the samples in flight: `samples.jsonl` for a
single process, `samples.rank{R}.jsonl` for rank R of a torchrun launch. The run's log is the union of these
files, so a restart with the same settings, with any number of ranks, skips what any of them holds; a torn
last line (killed mid-write) is cut off; any other damaged line (garbage, NUL bytes, a record without an
`id`) stops the run with its file and line, and `--repair-log` drops such lines (keeping a backup). When a
multi-rank run ends, rank 0 merges the shards into `samples.jsonl`. Every file is written through
`corelens.runs.files` (never through a planted link), and one process (rank 0 of a torchrun group) holds the
folder's lock (`corelens.runs.lock`) while it writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from corelens.data import jsonfile
from corelens.errors import CorelensError, InputError, warn
from corelens.runs import identity
from corelens.runs.dist import Dist
from corelens.runs.files import append, check_inside, read_bytes, refuse_link, write_text, writer
from corelens.runs.lock import Lock

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


def log_files(path: Path) -> list[Path]:
    """Return the log files of the run folder `path`: `samples.jsonl` first, then the rank shards in rank order."""
    shards = sorted(path.glob(SHARDS), key=lambda p: int(p.name.split(".")[1].removeprefix("rank")))
    return ([path / LOG] if (path / LOG).exists() else []) + shards


def unstarted(path: Path, manifest: dict) -> bool:
    """Return True for the run in folder `path` (its `manifest`) that never finished and logged no sample (in any
    process's log): nothing to resume, so another command may start afresh there."""
    if manifest.get("finished") is not None:
        return False
    return not any(read_bytes(log).strip() for log in log_files(path))


def model_data_settings(m, data: str | Path) -> dict:
    """Return the settings every run records about its model and sample file (path, hub commit, dtype, hash).

    The model is compared on resume by its identity (`model_config_hash`, the digest of
    `corelens.runs.identity`), never by where its files are: `model`, `model_id`, `model_commit` and the
    identity's summary `model_identity` record where it was found (LOCATION). The dtype is a setting (a bf16
    run does not resume an fp32 one); the device is not, since a run may resume on other hardware or with
    another number of ranks.
    """
    ident = m.identity()
    notes = list(getattr(m, "identity_notes", []))
    return {
        "model": str(Path(m.path).resolve()) if m.path is not None else None,
        "model_id": m.source.get("id"),
        "model_commit": m.source.get("commit"),
        "model_config_hash": ident["digest"],
        "model_identity": ident,
        "dtype": str(m.dtype).removeprefix("torch."),
        "data": str(Path(data).resolve()),
        "data_sha256": file_hash(data),
        # What a head set's model differs in, or that it was used anyway (--allow-other-model): HeadSet.check.
        **({"model_identity_notes": notes} if notes else {}),
    }


def write_json(path: Path, data: object, *, root: Path | None = None) -> None:
    """Write JSON atomically (a fresh temporary file + rename), never through a link at `path`."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", root=root)


def read_manifest(path: Path) -> dict:
    """Return a run's manifest; a damaged or unreadable one is one line naming it."""
    try:
        manifest = jsonfile.loads(read_bytes(path), path)
    except InputError:
        manifest = None
    if not isinstance(manifest, dict):
        raise CorelensError(f"{path}: is not a corelens manifest (truncated or damaged); restore it, or delete "
                            "the run folder (or use another --out) to start afresh")  # fmt: skip
    return manifest


# Settings that say where the model's files were found, not what the model is: not compared on resume (the
# identity digest `model_config_hash` is), and updated to the latest location when a run resumes.
LOCATION = frozenset({"model", "model_id", "model_commit", "model_identity", "model_identity_notes"})


def _legacy_same(before: dict, now: dict) -> bool:
    """Return True for a manifest of an earlier corelens (a path-dependent `model_config_hash`, no
    `model_identity`) whose model folder is the one loaded now: its hash cannot be compared path-free."""
    return "model_identity" not in before and before.get("model") == now.get("model")


def _model_change(before: dict, now: dict) -> str:
    """Return ": the run's model is A, not B; what differs: ..." (or why an old manifest cannot say)."""
    if "model_identity" not in before:
        return (
            f": the run was started by an earlier corelens on the model folder {before.get('model')} and "
            "recorded it by a path-dependent config hash; resume it with that --model folder"
        )
    return f": the run's model is {identity.explain(before['model_identity'], now['model_identity'])}"


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
        self.lock = Lock(self.path)
        if self.dist.main:
            self.path.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()  # rank 0 holds it for the group; released by `finish` or at exit
            check_inside(self.path / "figures" / "x", self.path)  # a linked figures/ would lead elsewhere
            for own in [manifest_path, self.path / LOG, *self.path.glob(SHARDS)]:
                refuse_link(own)  # not even read through a planted link
            (self.path / "figures").mkdir(exist_ok=True)
            old = (
                read_manifest(manifest_path)
                if manifest_path.is_file() or manifest_path.is_symlink()
                else None
            )
            if old is not None and self._unstarted(old):
                # Stopped before its first sample (an option refused once the model was known): nothing to
                # resume, so a corrected command starts afresh here (its cached prompt lengths go too).
                (self.path / "lengths.json").unlink(missing_ok=True)
                old = None
            if old is not None:
                self._check(old)
                self._say_resumed(old)
                self.manifest = old
                # The model may have moved: record where it is now (and an old manifest's identity, upgraded).
                self.manifest["settings"] = self.settings
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
            write_json(manifest_path, self.manifest, root=self.path)
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
            self.manifest = read_manifest(manifest_path)
            self._check(self.manifest)

    def _say_resumed(self, old: dict) -> None:
        """Say on stderr that this run goes on from answers logged earlier (after a code change they are old)."""
        done = sum(read_bytes(log).count(b"\n") for log in self.logs())
        state = "finished" if old.get("finished") else "stopped"
        print(f"corelens: resumed {self.path}: {done} sample record(s) logged earlier (the run {state}) are "
              "reused; use another --out, or delete the folder, to redo them", file=sys.stderr)  # fmt: skip

    def _unstarted(self, old: dict) -> bool:
        return unstarted(self.path, old)

    def _check(self, old: dict) -> None:
        """Refuse a run directory holding another command or other settings; where the model's files are
        (LOCATION) is no setting. A refusal over the model names both identities and what differs."""
        before = old.get("settings") if isinstance(old.get("settings"), dict) else {}
        keys = (set(before) | set(self.settings)) - LOCATION
        changed = sorted(k for k in keys if before.get(k) != self.settings.get(k))
        if changed == ["model_config_hash"] and _legacy_same(before, self.settings):
            # Started by a corelens whose hash held the path: the same folder is the same model.
            if self.dist.main:
                warn(f"{self.path}: this run recorded its model by an earlier, path-dependent config hash; "
                     "resumed on the same model folder, and now recorded by the path-free identity")  # fmt: skip
            changed = []
        if old.get("command") != self.command or changed:
            raise CorelensError(
                f"{self.path} holds a {old.get('command')!r} run with other settings ({', '.join(changed)})"
                f"{_model_change(before, self.settings) if 'model_config_hash' in changed else ''}; "
                "use another --out or delete it"
            )

    def logs(self) -> list[Path]:
        """Return the log files of this run: `samples.jsonl` first, then the rank shards in rank order."""
        return log_files(self.path)

    def records(self, check: Callable[[dict], None] | None = None) -> Iterator[dict]:
        """Yield the logged per-sample records of every process, each id once, in log order; `check(record)`
        (the experiment's) raising ValueError, TypeError or KeyError is one line naming the log and line."""
        seen: set[str] = set()
        for log in self.logs():
            for number, line in enumerate(read_bytes(log).split(b"\n"), 1):
                if line.strip():
                    record = _record(line)
                    if record is None:
                        raise InputError(
                            f"damaged run log line ({_what(line)}); run the same command with --repair-log "
                            "to drop the damaged lines (a backup of the log is kept)",
                            file=str(log),
                            line=number,
                        )
                    if check is not None and record.get("status") == "ok":
                        try:
                            check(record)
                        except (ValueError, TypeError, KeyError) as err:
                            what = f"field {err.args[0]!r} missing" if isinstance(err, KeyError) else err
                            raise InputError(
                                f"damaged run log record ({what}); delete that line to measure its sample again",
                                file=str(log),
                                line=number,
                            ) from None
                    if record["id"] not in seen:
                        seen.add(record["id"])
                        yield record

    def done(self) -> set[str]:
        """Return the ids of the samples already logged (finished or skipped) by any process."""
        return {r["id"] for r in self.records()}

    def log(self, record: dict) -> None:
        """Append one sample's record durably to this process's log."""
        append(self.log_path, json.dumps(record, separators=(",", ":")) + "\n", root=self.path)

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
        try:
            self._write_end(seconds, processes, extra)
        finally:
            self.lock.release()

    def _write_end(self, seconds: float, processes: list, extra: dict) -> None:
        self._merge()
        self.manifest.setdefault("timings", []).append(seconds)
        self.manifest.update(
            finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            processes=processes,
            world_size=self.dist.world,
            **extra,
        )
        write_json(self.path / MANIFEST, self.manifest, root=self.path)

    def table(self, frame, name: str) -> None:
        """Write a table (`.parquet`, else CSV) into the run folder atomically, never through a link."""
        with self.file(name) as f:
            if name.endswith(".parquet"):
                frame.to_parquet(f, index=False)
            else:
                f.write(frame.to_csv(index=False).encode("utf-8"))

    def file(self, name: str, mode: str = "wb"):
        """Return a context manager writing the run file `name` atomically, never through a link."""
        return writer(self.path / name, root=self.path, mode=mode)

    def _merge(self) -> None:
        """Fold the rank shards into `samples.jsonl` (atomically; a crash in between leaves duplicates that
        `records` drops), then remove them."""
        shards = [p for p in self.logs() if p.name != LOG]
        if not shards:
            return
        with self.file(LOG, "w") as f:
            for record in self.records():
                f.write(json.dumps(record, separators=(",", ":")) + "\n")
        for shard in shards:
            shard.unlink()


def _repair(log: Path) -> None:
    """Cut a torn last line (a process killed mid-write) off a log (rewritten atomically, never through a link)."""
    data = read_bytes(log)
    keep = data[: data.rfind(b"\n") + 1]
    if len(keep) != len(data):
        write_bytes_atomic(log, keep)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with writer(path, root=path.parent) as f:
        f.write(data)


def _record(line: bytes) -> dict | None:
    """Return a log line's record, or None when the line is damaged (not a JSON object with a string id)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("id"), str) else None


def _what(line: bytes) -> str:
    if b"\0" in line:
        return "NUL bytes"
    return "a record without an id" if line.lstrip().startswith(b"{") and _json(line) else "not JSON"


def _json(line: bytes) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def repair_logs(folder: str | Path) -> int:
    """Drop the damaged lines of a run's logs (a torn last line too), keeping a copy of each log it changes
    (`samples.jsonl.bak-<time>`); hold the run's lock meanwhile; print and return how many lines it dropped."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return 0  # nothing to repair: a new run
    lock = Lock(folder)
    lock.acquire()
    try:
        logs = sorted(folder.glob(SHARDS)) + ([folder / LOG] if (folder / LOG).is_file() else [])
        dropped = sum(_drop_damaged(log) for log in logs)
    finally:
        lock.release()
    print(
        f"corelens: --repair-log dropped {dropped} damaged line(s) from the logs of {folder}", file=sys.stderr
    )
    return dropped


def _drop_damaged(log: Path) -> int:
    """Rewrite `log` without its damaged lines, after a backup of it; return how many it dropped."""
    lines = read_bytes(log).split(b"\n")
    torn = lines.pop()  # b"" when the log ends with a newline
    kept = [line for line in lines if line.strip() and _record(line) is not None]
    dropped = len([line for line in lines if line.strip()]) - len(kept) + (1 if torn.strip() else 0)
    if dropped:
        stamp = time.strftime("%Y%m%dT%H%M%S")
        backup = log.with_name(f"{log.name}.bak-{stamp}")
        write_bytes_atomic(backup, read_bytes(log))
        write_bytes_atomic(log, b"".join(line + b"\n" for line in kept))
    return dropped
