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
`root`: the last guard, should a link planted in the output folder point elsewhere. `within(path, root)` is that
one rule for every reader and writer of corelens (run folders through `corelens.runs.files`, the report, an
export, a conversion): no link is followed out of the folder the user named.

Examples:
    >>> safe_name("2401075277"), safe_name("../../x"), safe_name("A")
    ('2401075277', '_.._x--9cdf6a50100a862e', 'a--559aead08264d579')
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from corelens.errors import InputError

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


class UnsafePath(InputError):
    """A path in a folder the user named that is a link, or leads out of the folder."""


def within(path: str | Path, root: str | Path | None) -> Path:
    """Return `path` when, resolved (links followed), it lies under `root` resolved; else raise `UnsafePath`
    naming the link on the way that leads out (the one rule of every reader and writer of corelens).

    Examples:
        >>> top = getfixture("tmp_path")
        >>> (top / "a").symlink_to("/")
        >>> within(top / "b.csv", top).name
        'b.csv'
        >>> within(top / "a" / "etc", top)
        Traceback (most recent call last):
        ...
        corelens.data.paths.UnsafePath: ...: a link to /, outside ...
    """
    path = Path(path)
    if root is None:
        return path
    top, resolved = Path(root).resolve(), path.resolve()
    if resolved == top or top in resolved.parents:
        return path
    link = next((p for p in (*reversed(path.parents), path) if p.is_symlink() and not _under(p, top)), None)
    what = f"{link}: a link to {link.resolve()}" if link else f"{path}: resolves to {resolved}"
    raise UnsafePath(
        f"{what}, outside {top}; corelens reads and writes only inside the folder you named "
        "(remove the link, or name another folder)"
    )


def _under(path: Path, top: Path) -> bool:
    resolved = path.resolve()
    return resolved == top or top in resolved.parents


def inside(root: str | Path, path: str | Path) -> Path:
    """Return `path` when, resolved (symlinks followed), it lies under `root` resolved; else raise the one-line
    `UnsafePath` naming the link that leads out (`within`, the one rule)."""
    return within(path, root)
