"""Deprecated alias of `corelens.models.families.llava_next.layout` (a family is one package now); kept for one release."""

import importlib
import warnings

warnings.warn(
    "corelens.models.llava_next is deprecated; import corelens.models.families.llava_next.layout",
    DeprecationWarning,
    stacklevel=2,
)
_new = importlib.import_module("corelens.models.families.llava_next.layout")


def __getattr__(name: str):
    return getattr(_new, name)
