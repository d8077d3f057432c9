"""Deprecation aliases of modules that moved (kept for one release): `corelens.models.qwen_vl` and the others."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable


def alias(old: str, new: str) -> Callable[[str], object]:
    """Warn that module `old` moved to `new`; return the `__getattr__` that serves `old`'s names from `new`."""
    warnings.warn(f"{old} is deprecated; import {new}", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(new)
    return lambda name: getattr(module, name)
