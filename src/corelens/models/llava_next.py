"""Deprecated alias of `corelens.models.families.llava_next.tokens` (a family is one package now); kept for one release."""

from corelens.models.moved import alias

__getattr__ = alias(__name__, "corelens.models.families.llava_next.tokens")
