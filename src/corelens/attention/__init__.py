"""The registered attention function and everything that runs inside it."""

from corelens.attention.dispatch import (
    NAME,
    AttentionCall,
    AttentionHook,
    activate,
    corelens_attention,
    register,
)
from corelens.attention.probes import RamProbe, row_probabilities

__all__ = [
    "NAME",
    "AttentionCall",
    "AttentionHook",
    "RamProbe",
    "activate",
    "corelens_attention",
    "register",
    "row_probabilities",
]
