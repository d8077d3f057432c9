"""Deprecated alias of `corelens.models.families.internvl.layout` (a family is one package now); kept for one release."""

import importlib
import warnings

warnings.warn(
    "corelens.models.internvl is deprecated; import corelens.models.families.internvl.layout",
    DeprecationWarning,
    stacklevel=2,
)
_new = importlib.import_module("corelens.models.families.internvl.layout")


def __getattr__(name: str):
    return getattr(_new, name)
