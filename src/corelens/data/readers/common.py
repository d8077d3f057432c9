"""What every reader shares: collecting records with a limit, and skipping or raising on a bad one."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from corelens.errors import InputError, OptionError


class Limit(Exception):
    """Raised inside a reader when the record limit is reached."""


class Records:
    """Converted records; a bad source record raises, or with `skip_bad` is listed in `skipped`."""

    def __init__(self, skip_bad: bool, limit: int | None) -> None:
        self.skip_bad = skip_bad
        self.limit = limit
        self.items: list[dict] = []
        self.skipped: list[dict] = []

    def skip(self, where: dict, reason: str) -> None:
        """List a source record left out on purpose (not malformed), with the reason."""
        self.skipped.append({**{k: v for k, v in where.items() if v is not None}, "reason": reason})

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


def number(value, where: dict, field: str, *, integer: bool = False) -> float | int:
    """Return `value` as a finite number (an int when `integer`); raise InputError naming `field` otherwise.

    A string, a bool, None, NaN or an infinity is refused: a dataset stores its numbers as numbers, and a
    string would otherwise surface later as a traceback (`int("abc")`) or a silent NaN box.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InputError(f"expected a number, got {value!r}", **where, field=field)
    if integer:
        if value != int(value):
            raise InputError(f"expected an integer, got {value!r}", **where, field=field)
        return int(value)
    return float(value)


def clip_box(box, width: float, height: float) -> tuple[list[float] | None, bool]:
    """Clip `[x0, y0, x1, y1]` to a `width` x `height` image: (the clipped box or None if empty, changed)."""
    x0, y0, x1, y1 = (float(v) for v in box)
    clipped = [
        min(max(x0, 0.0), width),
        min(max(y0, 0.0), height),
        min(max(x1, 0.0), width),
        min(max(y1, 0.0), height),
    ]
    changed = clipped != [x0, y0, x1, y1]
    if clipped[2] <= clipped[0] or clipped[3] <= clipped[1]:
        return None, changed
    return clipped, changed


def page_window(n_pages: int, evidence: list[int], max_pages: int | None, mode: str) -> list[int]:
    """Choose the 0-based pages to show of an `n_pages` document whose evidence pages are `evidence`.

    `mode` "window": `max_pages` consecutive pages centred on the evidence, every evidence page included
    (when the evidence spans more than `max_pages` pages, the evidence pages plus their nearest neighbours);
    "first": the first `max_pages` pages (evidence beyond them is not shown); "all": every page.
    Raises ValueError when the evidence pages alone are more than `max_pages`.
    """
    if mode not in PAGE_MODES:
        raise OptionError(f"pages must be one of {PAGE_MODES}, got {mode!r}")
    if mode == "all" or max_pages is None or n_pages <= max_pages:
        return list(range(n_pages))
    if mode == "first":
        return list(range(max_pages))
    if not evidence:
        return list(range(max_pages))
    if len(set(evidence)) > max_pages:
        raise ValueError(f"{len(set(evidence))} evidence pages are more than max_pages {max_pages}")
    lo, hi = min(evidence), max(evidence)
    if hi - lo + 1 <= max_pages:
        # A contiguous window centred on the evidence span, shifted back inside the document.
        start = max(0, min(lo - (max_pages - (hi - lo + 1)) // 2, n_pages - max_pages))
        return list(range(start, start + max_pages))
    # The evidence is spread wider than the window: keep every evidence page, fill with the pages nearest
    # to any evidence page (ties to the earlier page), so that each evidence page keeps some context.
    chosen = set(evidence)
    others = sorted(
        (p for p in range(n_pages) if p not in chosen), key=lambda p: (min(abs(p - e) for e in evidence), p)
    )
    chosen.update(others[: max_pages - len(chosen)])
    return sorted(chosen)


PAGE_MODES = ("window", "first", "all")
