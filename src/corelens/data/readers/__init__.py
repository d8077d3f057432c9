"""Readers of the native dataset formats: RefCOCOg, VidSTG, MMLongBench-Doc, MMDocIR -> corelens samples.

Each reader converts a dataset as it is published into the interchange JSONL (plus rendered page images
where the source is a PDF or a parquet of page images). `--data NAME:PATH` on any command converts once
into a cache folder (`$CORELENS_CACHE`, default `~/.cache/corelens/data`) keyed by the source's path, size
and modification time and the reader's options; `corelens data convert NAME:PATH --out DIR` writes it
where you choose. A malformed record raises an error naming the file, the record and the field, or with
`skip_bad` is skipped and listed in `skipped.jsonl` beside the converted file.

A reader is one module here whose `convert` is registered with `@reader` (`common.ReaderInterface`, named
by its module); docs/extending/reader.md is the template of a new one. The names are the modules' (known
without importing them, so parsing `--data` imports no reader); a reader's module is imported when it runs.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import pkgutil
from pathlib import Path

from corelens.data import jsonfile
from corelens.data.paths import inside
from corelens.data.readers.common import Converted, ReaderInterface, reader
from corelens.errors import CorelensError, OptionError


def reader_names() -> tuple[str, ...]:
    """Return the readers' names: every module of this package but `common` (found without importing them)."""
    return tuple(m.name for m in pkgutil.iter_modules(__path__) if m.name != "common")


READER_NAMES = reader_names()


def readers() -> ReaderInterface:
    """Return the registry of readers, every reader module imported (so registered)."""
    for name in reader_names():
        importlib.import_module(f"{__name__}.{name}")
    return ReaderInterface()


def parse_spec(spec: str) -> tuple[str, Path] | None:
    """Return (reader, source path) of a `NAME:PATH` spec, or None for a plain sample file."""
    name, sep, rest = str(spec).partition(":")
    if not sep or name not in reader_names():
        return None
    return name, Path(rest)


def check_options(name: str, options: dict) -> None:
    """Raise OptionError (`--options`) for a key that reader `name` does not take, listing the keys it does."""
    reader = readers()[name]
    known = [
        p.name
        for p in inspect.signature(reader).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name != "skip_bad"  # --skip-bad is an option of its own
    ]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise OptionError(
            f"--options: {name} takes no {', '.join(map(repr, unknown))}; its options are {', '.join(known)}"
        )


def _fingerprint(source: Path) -> dict:
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    return {
        "source": str(source.resolve()),
        "files": [
            (str(p.relative_to(source)) if p != source else p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in files
        ],
    }


def convert(spec: str, out: str | Path, *, skip_bad: bool = False, **options) -> Converted:
    """Convert the dataset of a `NAME:PATH` spec into folder `out` (JSONL + any rendered images)."""
    parsed = parse_spec(spec)
    if parsed is None:
        raise CorelensError(f"{spec!r}: expected NAME:PATH with NAME one of {', '.join(reader_names())}")
    name, source = parsed
    if not source.exists():
        raise CorelensError(f"{name}: {source} does not exist")
    check_options(name, options)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = readers()[name](source, out, skip_bad=skip_bad, **options)
    if result.skipped:
        lines = "".join(json.dumps(record) + "\n" for record in result.skipped)
        inside(out, out / "skipped.jsonl").write_text(lines)  # never through a link leading out of `out`
    return result


def cache_root() -> Path:
    """Return the folder where `NAME:PATH` specs are converted."""
    return Path(os.environ.get("CORELENS_CACHE", Path.home() / ".cache" / "corelens" / "data"))


def resolve(spec: str | Path, *, skip_bad: bool = False, **options) -> Path:
    """Return a sample file for `spec`: itself, or the cached conversion of a `NAME:PATH` dataset."""
    parsed = parse_spec(str(spec))
    if parsed is None:
        return Path(spec)
    name, source = parsed
    if not source.exists():
        raise CorelensError(f"{name}: {source} does not exist")
    check_options(name, options)
    key = json.dumps(
        {"reader": name, **_fingerprint(source), "skip_bad": skip_bad, **options}, sort_keys=True
    )
    folder = cache_root() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    done = folder / "converted.json"
    if done.is_file():
        return Path(jsonfile.load(done, root=folder)["path"])
    result = convert(str(spec), folder, skip_bad=skip_bad, **options)
    record = {"path": str(result.path), "n": result.n, "skipped": len(result.skipped)}
    inside(folder, done).write_text(json.dumps(record))
    return result.path


__all__ = [
    "READER_NAMES",
    "Converted",
    "ReaderInterface",
    "cache_root",
    "check_options",
    "convert",
    "parse_spec",
    "reader",
    "reader_names",
    "readers",
    "resolve",
]
