"""What every reader shares: its registry, collecting records with a limit, skipping or raising on a bad one."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from corelens.data import jsonfile
from corelens.errors import CorelensError, InputError, OptionError
from corelens.registry import Registry


@dataclass
class Converted:
    """The result of one conversion: the JSONL written, how many samples, and the records skipped."""

    path: Path
    n: int
    skipped: list[dict] = field(default_factory=list)


class ReaderInterface(Registry):
    """reader name -> `convert(source, out, *, skip_bad, **options) -> Converted`, named by its module."""

    kind = "dataset reader"
    error = CorelensError

    @staticmethod
    def name_of(convert: Callable) -> str:
        return convert.__module__.rpartition(".")[2]


def reader(convert: Callable[..., Converted]) -> Callable[..., Converted]:
    """Register a reader module's `convert` under the module's name (`--data NAME:PATH`); return it.

    Its keyword-only parameters (but `skip_bad`) are the reader's `--options`; docs/extending/reader.md is
    the template of a new reader.
    """
    return ReaderInterface.register(convert)


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
        from corelens.data.sample import write_samples

        write_samples(path, [{k: v for k, v in r.items() if v is not None} for r in self.items])
        return Converted(path, len(self.items), self.skipped)


def parse_json(text: str, **where):
    """Return the JSON value of `text` (one record of a JSON Lines file), or refuse it in one line naming
    `where` (file, line): invalid JSON, a repeated key, nesting or size over `jsonfile`'s bounds."""
    try:
        return jsonfile.parse(text, max_bytes=jsonfile.DATASET_MAX_BYTES)
    except ValueError as exc:
        raise InputError(f"invalid JSON: {exc}", **where) from None


def read_json(path: Path):
    """Return the JSON value of a dataset's annotation file `path`, bounded (`jsonfile.DATASET_MAX_BYTES`,
    checked before it is read), a repeated key or deep nesting refused in one line naming the file."""
    return jsonfile.load(path, max_bytes=jsonfile.DATASET_MAX_BYTES)


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield (line number, text) of a dataset's JSON Lines file, its size checked against
    `jsonfile.DATASET_MAX_BYTES` before it is read (each line then goes through `parse_json`)."""
    size, bound = path.stat().st_size, jsonfile.DATASET_MAX_BYTES
    if size > bound:
        raise InputError(
            f"{size} bytes is more than the {bound} a dataset file may hold here", file=str(path)
        )
    yield from enumerate(path.read_text().splitlines(), start=1)


def read_json_list(path: Path, refusal: str) -> list:
    """Return the JSON list in file `path`; invalid JSON or another value is refused (`refusal` says what)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(refusal, file=str(path))
    return data


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


def shown_pages(
    records: Records, where: dict, n_pages: int, evidence: list[int], max_pages: int | None, mode: str
) -> list[int] | None:
    """Return the 0-based pages to show of a question (`page_window`), or None when it is skipped (listed).

    A question is skipped when its evidence pages alone exceed `max_pages`, or when the window leaves one out.
    """
    try:
        shown = page_window(n_pages, evidence, max_pages, mode)
    except ValueError as exc:
        records.skip(where, f"{exc}; raise max_pages or use pages 'all'")
        return None
    missing = [p + 1 for p in evidence if p not in shown]
    if missing:
        records.skip(
            where,
            f"evidence page(s) {missing} not among the {len(shown)} pages shown "
            f"(pages {mode!r}, max_pages {max_pages})",
        )
        return None
    return shown
