"""File names made from data, and the check that a path written stays inside its output folder.

Every file or folder name that corelens derives from a dataset value (a RefCOCOg `question_id`, a VidSTG `vid`,
an MMDocIR `doc_name`, an MMLongBench `doc_id`, a sample id) goes through `safe_name`, one mapping
(docs/datasets.md, "Datasets in their native formats"):

- a value made only of `a-z`, `0-9`, `.`, `_` and `-`, at most `KEEP` characters long, other than `.` and
  `..`, and not ending the way a hashed name ends, is kept as it is;
- any other value becomes a readable slug (its safe characters, lower-cased, the rest as `_`, cut to `SLUG`
  characters) followed by `--` and the first 16 hex digits of the sha256 of the value.

Kept names never end in `--` + 16 hex digits and hashed names always do, so two different values never share
a name (short of a 64-bit hash collision), also on a case-insensitive file system (no upper-case letter is
kept). Then `inside(root, path)` resolves `path` (symlinks included) and refuses it unless it lies under
`root`: the last guard, should a link planted in the output folder point elsewhere.

Examples:
    >>> safe_name("2401075277"), safe_name("../../x"), safe_name("A")
    ('2401075277', '_.._x--9cdf6a50100a862e', 'a--559aead08264d579')
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

KEEP = 100  # longest value kept as it is (a file name may hold 255 bytes; room for a suffix)
SLUG = 60  # longest readable part of a hashed name
_SAFE = re.compile(r"[a-z0-9._-]+")
_HASHED = re.compile(r".*--[0-9a-f]{16}")


def safe_name(value: object) -> str:
    """Return the file name for dataset value `value` (see the module docstring): itself when safe, else slug--hash."""
    text = str(value)
    if (
        _SAFE.fullmatch(text)
        and text not in (".", "..")
        and len(text) <= KEEP
        and not _HASHED.fullmatch(text)
    ):
        return text
    slug = re.sub(r"[^a-z0-9._-]", "_", text.lower())[:SLUG].strip(".") or "_"
    return f"{slug}--{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def inside(root: str | Path, path: str | Path) -> Path:
    """Return `path` when, resolved (symlinks followed), it lies under `root` resolved; else raise the one-line
    `UnsafePath` (an InputError) naming the link that leads out: `corelens.runs.files.within`, the one rule."""
    from corelens.runs.files import within

    return within(path, root)
