"""The streaming pattern of docs/methods.md#hybrid, exact per query position, and the pair counts behind the ideal speed-up.

A streaming head lets query position `i` attend key position `j` iff `j <= i` and (`j - start < S` or
`i - j < W`): `S` sink tokens plus a window of `W` recent tokens (the query itself included). `start` is the
first real (non-padding) position of the batch row, so a left-padded sample keeps the same sinks as when it
runs alone; without padding it is 0 and the rule is `j < S` or `i - j < W`. The model's own mask (causal, padding)
always applies on top.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def allowed_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Return the model's attention mask as booleans (True = may attend); None stays None (plain causal)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    # Additive float masks hold 0 where allowed and a large negative number elsewhere.
    return mask > torch.finfo(mask.dtype).min / 2


def row_starts(mask: torch.Tensor | None, batch: int, device: torch.device) -> torch.Tensor:
    """Return per batch row the first key position the row's last query may attend (0 without a mask)."""
    mask = allowed_mask(mask)
    if mask is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    last = mask[:, 0, -1, :]  # the last query sees every real key up to itself, padding excluded
    first = last.int().argmax(dim=-1)
    return torch.where(last.any(dim=-1), first, torch.zeros_like(first)).expand(batch).long()


def streaming_keep(
    q_pos: torch.Tensor, k_pos: torch.Tensor, starts: torch.Tensor, sink: int, window: int
) -> torch.Tensor:
    """Return (batch, q, k) booleans: the streaming rule for query positions `q_pos` (batch, q) and keys (batch, k)."""
    q = q_pos[:, :, None]
    k = k_pos[:, None, :]
    return (k <= q) & (k >= 0) & ((k - starts[:, None, None] < sink) | (q - k < window))


def is_dense(n_keys: int, sink: int, window: int) -> bool:
    """Return whether the streaming rule keeps every causal pair for prompts of `n_keys` tokens (no padding)."""
    return n_keys <= sink + window


def pairs(n: int, sink: int, window: int) -> tuple[int, int]:
    """Return (P_full, P_stream): causal (query, key) pairs of an n-token prompt and those the pattern keeps."""
    i = np.arange(n, dtype=np.int64)
    sinks = np.minimum(sink, i + 1)
    recent = np.maximum(0, i - np.maximum(sink, i - window + 1) + 1)
    return n * (n + 1) // 2, int((sinks + recent).sum())


def ideal_speedup(n: int, full_fraction: float, sink: int, window: int) -> float:
    """Return the ideal attention speed-up (docs/methods.md#hybrid): P_full / (f P_full + (1 - f) P_stream)."""
    p_full, p_stream = pairs(n, sink, window)
    return p_full / (full_fraction * p_full + (1 - full_fraction) * p_stream)


def pooled_speedup(lengths: Sequence[int], full_fraction: float, sink: int, window: int) -> float:
    """Return the ideal speed-up over a set of prompts: all their causal pairs / all the pairs the policy keeps.

    Pooling the pairs (not evaluating `ideal_speedup` at the mean length) weights each prompt by its cost,
    since the pair count grows with the square of the length.
    """
    counts = np.array([pairs(int(n), sink, window) for n in lengths], dtype=np.float64).reshape(-1, 2)
    if not len(counts):
        return float("nan")
    p_full, p_stream = counts.sum(axis=0)
    return float(p_full / (full_fraction * p_full + (1 - full_fraction) * p_stream))
