"""Hybrid attention kernels behind one interface: (query, key, value, mask, full, sink, window, scale) -> output.

- ``reference``: the dense masked reference (every decision materialised; tests and small inputs);
- ``blocked``: the fast CPU path (sdpa for full heads, block-batched GEMMs for streaming heads);
- ``flex``: FlexAttention with a per-head block mask, compiled (the default for CUDA tensors);
- ``auto``: ``flex`` on CUDA, falling back to ``blocked`` (which runs on any device) if it fails; else ``blocked``.

All take post-RoPE queries (batch, heads, n, dim) and un-repeated GQA keys/values (batch, kv_heads, n, dim) of a
whole-prompt prefill (query i at key position i), the model's mask ((batch, 1, n, n) booleans, or None for
plain causal) and `full`, a (heads,) boolean tensor; they return (batch, n, heads, dim) in the query dtype.
"""

from __future__ import annotations

import logging

import torch

from corelens.attention.kernels.dense import masked_attention, policy_allowed, reference
from corelens.attention.kernels.flexattn import flex
from corelens.attention.kernels.semantics import (
    ideal_speedup,
    pairs,
    pooled_speedup,
    row_starts,
    streaming_keep,
)
from corelens.attention.kernels.tiles import blocked
from corelens.errors import OptionError

KERNELS = ("auto", "reference", "blocked", "flex")
log = logging.getLogger(__name__)

_IMPL = {"reference": reference, "blocked": blocked, "flex": flex}


def choose(kind: str, device: torch.device) -> str:
    """Return the concrete kernel `kind` resolves to on `device`."""
    if kind not in KERNELS:
        raise OptionError(f"unknown hybrid kernel {kind!r}; expected one of {KERNELS}")
    if kind != "auto":
        return kind
    return "flex" if device.type == "cuda" else "blocked"


def prefill(
    kind: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    full: torch.Tensor,
    sink: int,
    window: int,
    scale: float,
    *,
    fallback: str | None = "blocked",
) -> tuple[torch.Tensor, str, str | None]:
    """Run kernel `kind`; return (output, the kernel that ran, why the fallback was taken or None)."""
    name = choose(kind, query.device)
    try:
        return _IMPL[name](query, key, value, mask, full, sink, window, scale), name, None
    except Exception as err:  # any failure of an optional fast path falls back, logged once per call
        if fallback is None or fallback == name or kind != "auto":
            raise
        reason = f"{name} failed ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})"
        log.warning("corelens hybrid: %s; using %s", reason, fallback)
        return _IMPL[fallback](query, key, value, mask, full, sink, window, scale), fallback, reason


__all__ = [
    "KERNELS",
    "blocked",
    "choose",
    "flex",
    "ideal_speedup",
    "masked_attention",
    "pairs",
    "policy_allowed",
    "pooled_speedup",
    "prefill",
    "reference",
    "row_starts",
    "streaming_keep",
]
