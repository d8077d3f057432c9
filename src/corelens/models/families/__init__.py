"""The supported model families, one package each; importing this package registers every one of them.

A family is one package here (its layout, geometry checks and tiny-checkpoint builders inside it) that
builds a `corelens.models.families.family.Family` and registers it (`register`); docs/extending/family.md is
the template and docs/families.md lists what a family provides.
"""

from __future__ import annotations

from corelens.models.families.family import FIELDS, Family, FamilyInterface, register, video_as_given
from corelens.registry import import_modules


def import_all() -> list[str]:
    """Import (so register) every family package on this package's path; return their names."""
    return import_modules(__name__, __path__, packages_only=True)  # family.py is what they share


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
