"""Deprecated alias of `corelens.models.families.base` (a family is one package now); kept for one release."""

import importlib
import warnings

warnings.warn(
    "corelens.models.registry is deprecated; import corelens.models.families.base",
    DeprecationWarning,
    stacklevel=2,
)
_new = importlib.import_module("corelens.models.families.base")


def __getattr__(name: str):
    return getattr(_new, name)
