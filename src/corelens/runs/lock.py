"""One writer per run folder: a lock file naming its holder (pid, host, start time).

The lock (`run.lock` in the run folder) is created whole or not at all: its JSON is written to a temporary
file that is then hard-linked to the lock's name, which fails when the name exists (and never follows a link
there). Under torchrun rank 0 holds it for the group. A second process is refused with one line naming the
holder; a lock whose holder was killed (same host, pid no longer alive) is taken over with a warning. A
takeover is atomic: takers queue on an exclusive `flock` of the run folder and each checks, once it is its
turn, that the lock is still the dead holder's before removing it, so of many processes finding one stale lock
exactly one wins and the others are refused naming it. The lock is released when the run finishes and when the
process exits (also on an error).

Examples:
    >>> from corelens.runs.lock import Lock
    >>> lock = Lock(getfixture("tmp_path"))
    >>> lock.acquire(); lock.held
    True
    >>> lock.release(); lock.held
    False
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from corelens.errors import CorelensError, warn
from corelens.runs.files import denied

LOCK = "run.lock"
_HELD: set[Lock] = set()  # the locks this process holds, released by `release_all` (on an error, at exit)


class Locked(CorelensError):
    """Another live process is writing into the run folder."""


class Lock:
    """The lock file of one run folder, held by this process once `acquire` returns."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / LOCK
        self.held = False

    def acquire(self) -> None:
        """Take the lock; take over a stale one (its holder is dead); raise `Locked` when a live one holds it."""
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        for _ in range(3):  # a stale lock removed by a racing process: try again
            if self._create(me):
                self.held = True
                _HELD.add(self)
                return
            holder = self._holder()
            if holder is None:
                continue  # released between our try and the read
            if holder.get("pid") == me["pid"] and holder.get("host") == me["host"]:
                self.held = True  # this process already holds it (a second run object in one process)
                return
            if not _stale(holder, me["host"]):
                raise Locked(f"{self.path.parent}: another process is writing this run (pid {holder.get('pid')} "
                             f"on {holder.get('host')}, started {holder.get('started')}); wait for it to "
                             f"finish or use another --out (lock: {self.path})")  # fmt: skip
            with _one_taker(self.path.parent):
                if self._holder() != holder:
                    continue  # another taker was first: look again (its lock is live)
                warn(f"{self.path}: taking over the lock of a run that was killed (pid {holder.get('pid')} on "
                     f"{holder.get('host')}, started {holder.get('started')})")  # fmt: skip
                self._remove()
                if self._create(me):
                    self.held = True
                    _HELD.add(self)
                    return
        raise Locked(f"{self.path}: could not take the run lock; another process keeps taking it")

    def release(self) -> None:
        """Remove the lock file when this process holds it."""
        if self.held:
            self.held = False
            _HELD.discard(self)
            holder = self._holder()
            if holder is not None and holder.get("pid") == os.getpid():
                self._remove()

    def _create(self, me: dict) -> bool:
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{LOCK}.", suffix=".tmp")
        except PermissionError as err:
            raise denied(self.path, err) from None
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            os.link(tmp, self.path)  # atomic; fails when the name exists, even as a link
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _holder(self) -> dict | None:
        """Return the holder's record (None: no lock); a damaged lock is refused, naming the file."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise Locked(f"{self.path}: {err.strerror}; remove it if no run is writing this folder") from None
        with os.fdopen(fd) as f:
            text = f.read(4096)
        try:
            holder = json.loads(text)
        except ValueError:
            holder = None
        if not isinstance(holder, dict):
            raise Locked(
                f"{self.path}: is not a corelens run lock; remove it if no run is writing this folder"
            )
        return holder

    def _remove(self) -> None:
        self.path.unlink(missing_ok=True)


@contextmanager
def _one_taker(folder: Path) -> Iterator[None]:
    """Hold an exclusive `flock` of `folder` inside the block: takers of a stale lock go one at a time (the
    kernel drops it if this process dies)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def release_all() -> None:
    """Release every lock this process holds (the command line calls it when a command ends, also on an error)."""
    for lock in list(_HELD):
        lock.release()


atexit.register(release_all)


def _stale(holder: dict, host: str) -> bool:
    """Return True when the holder ran on this host and its process no longer exists."""
    if holder.get("host") != host or not isinstance(holder.get("pid"), int):
        return False  # another machine's process cannot be checked from here: assume it lives
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, owned by another user
    return False
