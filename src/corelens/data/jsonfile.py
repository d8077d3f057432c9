"""Reading JSON that corelens did not necessarily write: bounded in size and depth, a repeated key refused.

Every JSON document corelens reads (a manifest, a head set, a policy file, a run's side files, a dataset's
annotations) goes through `loads` or `load`: Python's `json` keeps the last of two equal keys silently (a head
set or a policy would lose the first), reads a file of any size into memory and fails with a traceback on
nesting deeper than its recursion limit. Here a repeated key, a document over `MAX_BYTES` (a dataset's
annotation file passes `DATASET_MAX_BYTES`), nesting over `MAX_DEPTH` or text that is not JSON is one line
naming the file (and, for a repeated key, the key). `parse` is the same check raising `ValueError`, for a
reader that names a line or a field itself (a JSON Lines record). It sits in `data`, the lowest layer that
reads files, so the dataset readers and the run folders share it.

Examples:
    >>> loads('{"a": [1, {"b": 2}]}', "x.json")
    {'a': [1, {'b': 2}]}
    >>> loads('{"a": 1, "a": 2}', "x.json")
    Traceback (most recent call last):
    ...
    corelens.errors.InputError: x.json: not valid JSON (key 'a' is repeated)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from corelens.data.paths import within
from corelens.errors import InputError

MAX_BYTES = 64 << 20  # a manifest, head set or policy is kilobytes; 64 MiB leaves room for any model's
# A dataset's annotation file is larger: COCO's instances.json is 0.4 GB, VidSTG's train annotations 0.2 GB.
DATASET_MAX_BYTES = 2 << 30
MAX_DEPTH = (
    64  # no corelens file, and no record of a supported dataset, nests deeper than a handful of levels
)


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} is repeated")
        seen.add(key)
    return dict(pairs)


def _depth(value: Any) -> int:
    """Return how deep `value` nests (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, depth + 1) for v in item]
    return deepest


def _too_big(size: int, max_bytes: int) -> str:
    return f"{size} bytes is more than the {max_bytes} a JSON file may hold here"


class Unbounded(ValueError):
    """A JSON text over a size or depth bound (`parse`); any other `ValueError` of `parse` is bad JSON."""


def parse(text: str | bytes, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, **options) -> Any:
    """Return the JSON value of `text`; raise `ValueError` (its message one line) on a repeated key or text
    that is not JSON, `Unbounded` on a text over `max_bytes` or nesting over `max_depth`. `options` go to
    `json.loads` (`parse_constant=` to refuse NaN).

    Examples:
        >>> parse('[[[1]]]', max_depth=2)
        Traceback (most recent call last):
        ...
        corelens.data.jsonfile.Unbounded: nested more than 2 levels deep
    """
    if len(text) > max_bytes:
        raise Unbounded(_too_big(len(text), max_bytes))
    try:
        value = json.loads(text, object_pairs_hook=_unique, **options)
    except RecursionError:  # nesting deeper than json itself reads
        raise Unbounded(f"nested more than {max_depth} levels deep") from None
    except ValueError as err:
        raise ValueError(str(err)) from None
    if _depth(value) > max_depth:
        raise Unbounded(f"nested more than {max_depth} levels deep")
    return value


def loads(
    text: str | bytes, where: str | Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """Return the JSON value of `text`; refuse (one line naming `where`) a repeated key, a document over
    `max_bytes`, nesting over `max_depth` or text that is not JSON."""
    try:
        return parse(text, max_bytes=max_bytes, max_depth=max_depth)
    except Unbounded as err:
        raise InputError(str(err), file=str(where)) from None
    except ValueError as err:
        raise InputError(f"not valid JSON ({err})", file=str(where)) from None


def load(
    path: str | Path,
    *,
    root: str | Path | None = None,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Return the JSON value of the file at `path` (see `loads`), never read through a link leading out of
    `root`; its size is checked before it is read."""
    path = within(path, root)
    try:
        size = os.stat(path).st_size
        if size > max_bytes:
            raise InputError(_too_big(size, max_bytes), file=str(path))
        text = path.read_bytes()
    except OSError as err:  # missing, unreadable (permissions), a folder
        raise InputError(f"cannot read it ({err.strerror})", file=str(path)) from None
    return loads(text, path, max_bytes=max_bytes, max_depth=max_depth)
