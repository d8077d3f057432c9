"""What every reader shares: collecting records with a limit, and skipping or raising on a bad one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from corelens.errors import InputError


class Limit(Exception):
    """Raised inside a reader when the record limit is reached."""


class Records:
    """Converted records; a bad source record raises, or with `skip_bad` is listed in `skipped`."""

    def __init__(self, skip_bad: bool, limit: int | None) -> None:
        self.skip_bad = skip_bad
        self.limit = limit
        self.items: list[dict] = []
        self.skipped: list[dict] = []

    def add(self, record: dict) -> None:
        """Keep one converted record (stops the reader at the limit)."""
        if self.limit is not None and len(self.items) >= self.limit:
            raise Limit
        self.items.append(record)

    @contextmanager
    def guard(self, where: dict) -> Iterator[None]:
        """Convert one source record: an InputError is raised, or logged when skipping bad records."""
        try:
            yield
        except InputError as err:
            if not self.skip_bad:
                raise
            self.skipped.append({**{k: v for k, v in where.items() if v is not None}, "error": str(err)})

    def write(self, path: Path):
        """Write the records to the JSONL `path` (None fields dropped); return the Converted result."""
        from corelens.data.readers import Converted
        from corelens.data.sample import write_samples

        write_samples(path, [{k: v for k, v in r.items() if v is not None} for r in self.items])
        return Converted(path, len(self.items), self.skipped)


def run_until_limit(fn, *args, **kwargs) -> None:
    """Call a reader body, treating the record limit as a normal end."""
    with suppress(Limit):
        fn(*args, **kwargs)


def find_one(folder: Path, names: list[str], what: str) -> Path:
    """Return the first of `names` in `folder` (or `folder` itself if it is one of them)."""
    if folder.is_file() and folder.name in names:
        return folder
    for name in names:
        if (folder / name).is_file():
            return folder / name
    for name in names:
        hits = sorted(folder.rglob(name)) if folder.is_dir() else []
        if hits:
            return hits[0]
    raise InputError(f"{what} not found (looked for {', '.join(names)})", file=str(folder))
