"""The supported model families, one package each; importing this package registers every one of them.

A family is one package here (its layout, geometry checks and tiny-checkpoint builders inside it) that
builds a `corelens.models.families.family.Family` and registers it (`register`); docs/extending/family.md is
the template and docs/families.md lists what a family provides.
"""

from __future__ import annotations

import importlib
import pkgutil

from corelens.models.families.family import FIELDS, Family, FamilyInterface, register, video_as_given


def import_all() -> list[str]:
    """Import (so register) every family package on this package's path; return their names."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.ispkg]  # base.py is what they share
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


import_all()

FAMILIES = FamilyInterface()


def family_of(model_type: str) -> Family:
    """Return the registered family of `model_type`, or refuse it with the supported ones."""
    if model_type not in FAMILIES:
        raise FamilyInterface.error(
            f"model_type {model_type!r} is not supported; supported: {list(FAMILIES)}"
        )
    return FAMILIES[model_type]


__all__ = [
    "FAMILIES",
    "FIELDS",
    "Family",
    "FamilyInterface",
    "family_of",
    "import_all",
    "register",
    "video_as_given",
]
