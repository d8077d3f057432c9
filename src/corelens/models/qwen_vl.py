"""Deprecated alias of `corelens.models.families.qwen2_vl.tokens` (a family is one package now); kept for one release."""

from corelens.models.moved import alias

__getattr__ = alias(__name__, "corelens.models.families.qwen2_vl.tokens")
