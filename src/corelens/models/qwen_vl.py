"""Deprecated alias of `corelens.models.families.qwen2_vl.layout` (a family is one package now); kept for one release."""

import importlib
import warnings

warnings.warn(
    "corelens.models.qwen_vl is deprecated; import corelens.models.families.qwen2_vl.layout",
    DeprecationWarning,
    stacklevel=2,
)
_new = importlib.import_module("corelens.models.families.qwen2_vl.layout")


def __getattr__(name: str):
    return getattr(_new, name)
