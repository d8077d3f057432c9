"""Exceptions that name the file, sample and field at fault."""

from __future__ import annotations

import sys


class CorelensError(Exception):
    """Base class of every error corelens raises on purpose (the CLI prints these without a traceback)."""


class InputError(CorelensError):
    """Bad user input: a sample file, a record, a field or a target; the message says where."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        sample: str | None = None,
        field: str | None = None,
    ) -> None:
        self.file, self.line, self.sample, self.field = file, line, sample, field
        where = []
        if file is not None:
            where.append(f"{file}" + (f":{line}" if line is not None else ""))
        if sample is not None:
            where.append(f"sample {sample!r}")
        if field is not None:
            where.append(f"field {field!r}")
        self.reason = message
        super().__init__((", ".join(where) + ": " if where else "") + message)


class OptionError(CorelensError, ValueError):
    """A value the caller chose that cannot work: a command-line option, or a keyword of the Python API.

    Also a `ValueError`, so that code catching the built-in error for a bad value still does.
    """


class UnsupportedModelError(CorelensError):
    """A checkpoint whose architecture corelens does not (yet) support."""


def warn(message: str) -> None:
    """Print a corelens warning on standard error (the default `warn` of long-running experiments)."""
    print(f"corelens: warning: {message}", file=sys.stderr)
