"""Writing into a run folder without following links: every table, figure, manifest and log goes through here.

A run folder may hold links someone else planted (`heads.csv -> ~/.bashrc`). A file is therefore written to a
fresh temporary name beside it (`tempfile.mkstemp`: created with O_EXCL, never an existing file or link) and
renamed over the destination, which replaces a link instead of writing through it; a destination that is a
link, or a folder on the way that leads out of the run folder, is refused with one line naming it. Logs are
appended through `os.open(..., O_NOFOLLOW)`. A stray temporary file of a crashed write is never reused.

Examples:
    >>> import pandas as pd
    >>> from corelens.runs.files import write_bytes, writer
    >>> run = getfixture("tmp_path")
    >>> with writer(run / "t.csv", root=run) as f:
    ...     pd.DataFrame({"a": [1]}).to_csv(f, index=False)
    >>> write_bytes(run / "x.bin", b"1", root=run).read_bytes()
    b'1'
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from corelens.errors import CorelensError


class UnsafePath(CorelensError):
    """A path in a run folder that is a link, or leads out of the folder."""


def refuse_link(path: Path) -> None:
    """Raise `UnsafePath` when `path` is a symbolic link (dangling or not)."""
    if path.is_symlink():
        raise UnsafePath(f"{path}: is a symbolic link; corelens does not write through links in a run folder "
                         "(remove it, or use another --out)")  # fmt: skip


def check_inside(path: Path, root: Path | None) -> None:
    """Raise `UnsafePath` when `path` is a link or its folder does not resolve under `root` (the run folder)."""
    refuse_link(path)
    if root is None:
        return
    folder, top = path.parent.resolve(), Path(root).resolve()
    if folder != top and top not in folder.parents:
        raise UnsafePath(f"{path}: resolves to {folder / path.name}, outside the run folder {top} (a folder "
                         "on the way is a link); remove the link, or use another --out")  # fmt: skip


def refuse_read_only(path: Path) -> None:
    """Raise the one-line error when `path` exists read-only: a file someone protected is not replaced.

    Checked on the mode bits as well as with `os.access`, so that root (who may write anything) is refused too.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_IMODE(mode) & 0o222 or not os.access(path, os.W_OK):
        raise denied(path, PermissionError(errno.EACCES, "file is read-only"))


def denied(path: Path, err: OSError) -> CorelensError:
    """Return the one-line error of a file the run cannot read or write (read-only files or folders)."""
    reason = err.strerror or type(err).__name__
    return CorelensError(
        f"{path}: {reason}; make the run folder and its files writable, or use another --out"
    )


@contextmanager
def writer(path: str | Path, *, root: str | Path | None = None, mode: str = "wb") -> Iterator:
    """Yield a file to write `path`'s new content into; on success it replaces `path` atomically.

    The content goes to a temporary file created in the same folder (O_EXCL: never a planted link), which is
    renamed over `path` when the block ends and removed when it fails; `path` itself is never opened.
    """
    path = Path(path)
    check_inside(path, root)
    refuse_read_only(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except PermissionError as err:
        raise denied(path, err) from None
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except PermissionError as err:
        raise denied(path, err) from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_bytes(path: str | Path, data: bytes, *, root: str | Path | None = None) -> Path:
    """Write `data` to `path` atomically, never through a link; return the path."""
    with writer(path, root=root) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | Path, text: str, *, root: str | Path | None = None) -> Path:
    """Write `text` (UTF-8) to `path` atomically, never through a link; return the path."""
    return write_bytes(path, text.encode("utf-8"), root=root)


def append(path: str | Path, text: str, *, root: str | Path | None = None) -> None:
    """Append `text` to `path` and fsync it, never through a link (O_NOFOLLOW); create it when missing."""
    path = Path(path)
    check_inside(path, root)
    refuse_read_only(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except PermissionError as err:
        raise denied(path, err) from None
    except OSError as err:  # ELOOP: a link planted between the check and the open
        raise UnsafePath(
            f"{path}: {err.strerror}; corelens does not write through links in a run folder"
        ) from None
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_bytes(path: str | Path) -> bytes:
    """Return a run file's bytes; a file the run cannot read is one line naming it."""
    try:
        return Path(path).read_bytes()
    except PermissionError as err:
        raise denied(Path(path), err) from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
