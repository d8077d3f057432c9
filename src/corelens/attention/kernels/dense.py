"""The dense masked reference: every (head, query, key) decision materialised, fp32 softmax. Small inputs only.

`masked_attention` is also the general path for calls that are not a whole-prompt prefill (decoding steps,
cache extensions): there the number of queries is small and the dense mask costs little.
"""

from __future__ import annotations

import torch

from corelens.attention.kernels.interface import Prefill, kernel
from corelens.attention.kernels.masks import Pattern, allowed_mask, evaluate, hybrid_mask_function, row_starts


def masked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Return attention (batch, q, heads, dim) under a boolean `allowed` broadcastable to (batch, heads, q, k).

    GQA-aware without repeating keys; fp32 scores and softmax; a row with no allowed key outputs 0 (as sdpa).
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    q = query.float().reshape(batch, kv_heads, groups, q_len, dim)
    scores = torch.einsum("bkgqd,bknd->bkgqn", q, key.float()).mul_(scale)
    allowed = allowed.expand(batch, heads, q_len, k_len).reshape(batch, kv_heads, groups, q_len, k_len)
    scores.masked_fill_(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
    out = torch.einsum("bkgqn,bknd->bkgqd", probs, value.float())
    return out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).to(query.dtype)


def policy_allowed(
    full: torch.Tensor,
    mask: torch.Tensor | None,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    starts: torch.Tensor,
    pattern: Pattern,
) -> torch.Tensor:
    """Return (batch, heads, q, k) booleans: the model mask AND the hybrid rule (`masks.hybrid_mask_function`).

    `mask` is the model's mask over these queries and keys (None = causal); `q_pos` / `k_pos` (batch, q|k) are
    absolute positions, `starts` (batch,) the rows' first real positions, `full` (heads,) the full-head flags.
    """
    full = full.to(q_pos.device)
    allowed = evaluate(hybrid_mask_function(pattern, full, starts), q_pos, k_pos, heads=len(full))
    model = allowed_mask(mask)
    return allowed if model is None else allowed & model


def last_rows_allowed(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, full: torch.Tensor, pattern: Pattern
) -> torch.Tensor:
    """Return `policy_allowed` of queries that are the last q of the k key positions (a prefill, a decoding step)."""
    batch, _, q_len, _ = query.shape
    k_len = key.shape[2]
    device = query.device
    k_pos = torch.arange(k_len, device=device).expand(batch, k_len)
    q_pos = torch.arange(k_len - q_len, k_len, device=device).expand(batch, q_len)
    return policy_allowed(full, mask, q_pos, k_pos, row_starts(mask, batch, device), pattern)


@kernel("reference")
def reference(call: Prefill) -> torch.Tensor:
    """Return hybrid attention (batch, q, heads, dim) from the dense mask; queries are the last q key positions."""
    allowed = last_rows_allowed(call.query, call.key, call.mask, call.full, call.pattern)
    return masked_attention(call.query, call.key, call.value, allowed, call.scale)
