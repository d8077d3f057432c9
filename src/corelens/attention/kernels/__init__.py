"""Hybrid attention kernels behind one interface: (query, key, value, mask, full, pattern, scale) -> output.

- ``reference``: the dense masked reference (every decision materialised; tests and small inputs);
- ``blocked``: the fast CPU path (sdpa for full heads, block-batched GEMMs for streaming heads);
- ``flex``: FlexAttention with a per-head block mask, compiled (by name only; `auto` took it on CUDA before the
  partitioned kernel);
- ``partitioned``: the full heads through stock causal sdpa on their own heads, the streaming heads in one
  Triton kernel (sinks and window in one online softmax, `stream.py`; on CUDA), as flash-attention calls with a
  left window and a top-left sink pass joined by one fused merge (`flashstream.py`; CUDA, 16-bit), or as a
  window pass and a sink pass merged by log-sum-exp (FlexAttention, one block mask shared by all heads; any
  device). Where a layer's head set would gain too little
  (`DENSE_BELOW`, in corelens.choices; the `dense_below` argument) it runs every head dense and reports ``dense``;
- ``auto``: ``partitioned`` on CUDA (with its dense crossover), falling back to ``blocked`` (which runs on any
  device) if it fails, with a RuntimeWarning and the reason in the session's record; else ``blocked``.

All take post-RoPE queries (batch, heads, n, dim) and un-repeated GQA keys/values (batch, kv_heads, n, dim) of a
whole-prompt prefill (query i at key position i), the model's mask ((batch, 1, n, n) booleans, or None for
plain causal), `full`, a (heads,) boolean tensor, and the `Pattern` (S sinks, W window) whose one rule
(`masks.py`, docs/methods.md#hybrid) they all derive from; they return (batch, n, heads, dim) in the query
dtype.
"""

from __future__ import annotations

import warnings

import torch

from corelens.attention.kernels.dense import masked_attention, policy_allowed, reference
from corelens.attention.kernels.flexattn import flex
from corelens.attention.kernels.interface import KernelInterface, Prefill, kernel
from corelens.attention.kernels.masks import (
    Pattern,
    ideal_speedup,
    pairs,
    pooled_speedup,
    row_starts,
    streaming_keep,
)
from corelens.attention.kernels.partition import partitioned, takes_dense
from corelens.attention.kernels.tiles import Plans, blocked
from corelens.choices import DENSE_BELOW, KERNELS
from corelens.errors import OptionError

# name -> kernel: every module above registered its kernel on import (`interface.kernel`).
IMPLEMENTATIONS = KernelInterface()


def choose(kind: str, device: torch.device) -> str:
    """Return the concrete kernel `kind` resolves to on `device`."""
    if kind not in KERNELS:
        raise OptionError(f"unknown hybrid kernel {kind!r}; expected one of {KERNELS}")
    if kind != "auto":
        return kind
    if device.type == "cuda":
        # The CUDA path: full heads on the baseline's own sdpa backend, streaming heads as window + sink passes
        # on one shared block mask each (flex's per-head masks and Triton dense tiles cost more; issue 28).
        return "partitioned"
    # Elsewhere the blocked kernel: sdpa for the full heads, the C++ band kernel / split tiles for the rest.
    return "blocked"


def prefill(
    kind: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    full: torch.Tensor,
    pattern: Pattern,
    scale: float,
    *,
    plans: Plans | None = None,
    fallback: str | None = "blocked",
    dense_below: float | None = DENSE_BELOW,
) -> tuple[torch.Tensor, str, str | None]:
    """Run kernel `kind`; return (output, the kernel that ran, why the fallback was taken or None).

    `plans`: the caller's memo of the mask's padding, for the blocked and partitioned kernels (one scan per
    forward). `dense_below`: the partitioned kernel's crossover (None or 0: never); below it every head runs
    dense and the kernel that ran is ``dense``.
    """
    name = choose(kind, query.device)
    if name == "partitioned" and takes_dense(query.shape[2], full, pattern, dense_below, query.device):
        full = torch.ones_like(full, dtype=torch.bool)  # every head causal: one stock sdpa call
        return _run(name, (query, key, value, mask, full, pattern, scale), plans), "dense", None
    args = (query, key, value, mask, full, pattern, scale)
    try:
        return _run(name, args, plans), name, None
    except Exception as err:  # any failure of an optional fast path falls back, logged once per call
        if fallback is None or fallback == name or kind != "auto":
            raise
        reason = f"{name} failed ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})"
        # A warning (stderr), and the session records the reason for the run's manifest (policy report); the
        # benches refuse a fallback (`corelens.bench.hybrid_kernels.refuse_fallback`).
        warnings.warn(f"corelens hybrid: {reason}; using {fallback}", RuntimeWarning, stacklevel=2)
        return _run(fallback, args, plans), fallback, reason


def _run(name: str, args: tuple, plans: Plans | None) -> torch.Tensor:
    run = IMPLEMENTATIONS[name]
    # A plain function put in one instance (a test's stand-in) takes no plans.
    return run(*args, plans=plans) if getattr(run, "takes_plans", False) else run(*args)


__all__ = [
    "DENSE_BELOW",
    "IMPLEMENTATIONS",
    "KERNELS",
    "KernelInterface",
    "Pattern",
    "Plans",
    "Prefill",
    "blocked",
    "choose",
    "flex",
    "ideal_speedup",
    "kernel",
    "masked_attention",
    "pairs",
    "partitioned",
    "policy_allowed",
    "pooled_speedup",
    "prefill",
    "reference",
    "row_starts",
    "streaming_keep",
]
