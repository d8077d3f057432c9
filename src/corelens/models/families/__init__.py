"""The supported model families, one package each; importing this package registers every one of them.

A family is one package here (its layout, geometry checks and tiny-checkpoint builders inside it) that
builds a `corelens.models.families.base.Family` and registers it (`register`); docs/extending/family.md is
the template and docs/families.md lists what a family provides.
"""

from __future__ import annotations

import importlib
import pkgutil

from corelens.models.families.base import FIELDS, Family, FamilyInterface, register, video_as_given

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg:  # a family is a package; base.py is what they share
        importlib.import_module(f"{__name__}.{_module.name}")

FAMILIES = FamilyInterface()


def family_of(model_type: str) -> Family:
    """Return the registered family of `model_type`, or refuse it with the supported ones."""
    if model_type not in FAMILIES:
        raise FamilyInterface.error(
            f"model_type {model_type!r} is not supported; supported: {list(FAMILIES)}"
        )
    return FAMILIES[model_type]


__all__ = ["FAMILIES", "FIELDS", "Family", "FamilyInterface", "family_of", "register", "video_as_given"]
