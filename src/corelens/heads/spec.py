"""The head-set format's name and the rule of its counts, shared by the artifact (artifact.py) and its
schema (schema.py), so that neither imports the other."""

from __future__ import annotations

import numbers
from typing import Any

from corelens.errors import CorelensError

FORMAT = "corelens.headset/1"


def count(value: Any, what: str) -> int:
    """Return `value` as a positive int; raise CorelensError naming `what` for a bool, float, string, or <= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise CorelensError(f"{what} must be a positive integer, got {value!r}")
    return int(value)
