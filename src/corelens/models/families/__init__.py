"""The supported model families, one file each; importing this package registers every module in it.

Adding a family is adding one file here that builds a `corelens.models.registry.Family` and registers it
(`FamilyInterface.register`); docs/families.md lists what a family provides.
"""

from __future__ import annotations

import importlib
import pkgutil

from corelens.errors import UnsupportedModelError
from corelens.models.registry import Family, FamilyInterface

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

FAMILIES = FamilyInterface()


def family_of(model_type: str) -> Family:
    """Return the registered family of `model_type`, or refuse it with the supported ones."""
    if model_type not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {list(FAMILIES)}"
        )
    return FAMILIES[model_type]


__all__ = ["FAMILIES", "Family", "FamilyInterface", "family_of"]
