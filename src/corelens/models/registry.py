"""Deprecated alias of `corelens.models.families.family` (a family is one package now); kept for one release."""

from corelens.models.moved import alias

__getattr__ = alias(__name__, "corelens.models.families.family")
