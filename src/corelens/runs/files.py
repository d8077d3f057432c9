"""Reading and writing inside a folder the user named without following links out of it: every run-folder
table, figure, manifest and log, the report's inputs, an exported head set and a converted dataset go through
here (one rule, `within`).

A run folder may hold links someone else planted (`heads.csv -> ~/.bashrc`). A file is therefore written to a
fresh temporary name beside it (`tempfile.mkstemp`: created with O_EXCL, never an existing file or link) and
renamed over the destination, which replaces a link instead of writing through it; a destination that is a
link, or a folder on the way that leads out of the run folder, is refused with one line naming it. Logs are
appended through `os.open(..., O_NOFOLLOW)`. A stray temporary file of a crashed write is never reused.
Reads follow a link only while it stays inside the named folder (`within`, `read_bytes(..., root=)`,
`refuse_links_out` for a whole folder a command reads, such as `report RUN` or `export RUN`).

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

from corelens.data.paths import UnsafePath, within
from corelens.errors import CorelensError


def folder(path: str | Path, root: str | Path | None = None) -> Path:
    """Create folder `path` (and its parents) unless it leads out of `root` (checked first); return it."""
    path = within(path, root)
    path.mkdir(parents=True, exist_ok=True)
    return within(path, root)


def refuse_links_out(folder: str | Path) -> Path:
    """Raise `UnsafePath` when any entry of `folder` (walked without following links) is a link leading out of
    it; return `folder`. A command that reads a whole folder (a report's run, an export's rank run) calls it
    first, so no later reader can embed a file from elsewhere."""
    folder = Path(folder)
    for parent, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files):
            entry = Path(parent) / name
            if entry.is_symlink():
                within(entry, folder)
    return folder


def refuse_link(path: Path) -> None:
    """Raise `UnsafePath` when `path` is a symbolic link (dangling or not)."""
    if path.is_symlink():
        raise UnsafePath(f"{path}: is a symbolic link; corelens does not write through links in a run folder "
                         "(remove it, or use another --out)")  # fmt: skip


def check_inside(path: Path, root: Path | None) -> None:
    """Raise `UnsafePath` when `path` (to be written) is a link or does not resolve under `root`."""
    refuse_link(path)
    within(path, root)


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


def refuse_full(path: Path, err: OSError) -> None:
    """Raise the one-line error of a full disk (or quota) met while writing `path`; return for any other error.

    Nothing finished is lost: a table or manifest is replaced only once whole, and a log's torn last line is
    cut off when the run resumes.
    """
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        raise CorelensError(
            f"disk full while writing {path}; nothing finished is lost; rerun to resume"
        ) from None


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
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except PermissionError as err:
        raise denied(path, err) from None
    except OSError as err:
        refuse_full(path, err)
        raise
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
    try:
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:  # a torn last line is cut off when the run resumes
        refuse_full(path, err)
        raise


def read_bytes(path: str | Path, *, root: str | Path | None = None) -> bytes:
    """Return a file's bytes, refusing a link out of `root`; a file the run cannot read is one line naming it."""
    try:
        return within(path, root).read_bytes()
    except PermissionError as err:
        raise denied(Path(path), err) from None


def read_text(path: str | Path, *, root: str | Path | None = None) -> str:
    """Return a file's text (UTF-8), refusing a link out of `root` (see `read_bytes`)."""
    return read_bytes(path, root=root).decode("utf-8")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
