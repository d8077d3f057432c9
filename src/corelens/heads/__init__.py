"""Head sets as portable artifacts (`artifact`) and their foreign formats (`formats`: DuoAttention, SparseMM)."""

from corelens.heads.artifact import FORMAT, HeadSet, check_heads, config_hash, resolve_heads

__all__ = ["FORMAT", "HeadSet", "check_heads", "config_hash", "resolve_heads"]
