"""The one mask rule of hybrid attention (docs/methods.md#hybrid), as small mask functions that compose.

A streaming head lets query position `i` attend key position `j` iff

    j <= i  and  (j - s < S  or  i - j < W)

`S` sink tokens plus a window of `W` recent tokens (the query itself included); `s` is the first real
(non-padding) position of the batch row, so a left-padded sample keeps the same sinks as when it runs alone
(0 without padding). A full head keeps every `j <= i`. The model's own mask (causal, padding) applies on top.

The mask functions follow transformers' masking_utils (`(batch, head, q, kv) -> bool`, composed with
`and_masks` / `or_masks`), so one function is evaluated on index grids by the dense reference (`evaluate`),
serves as FlexAttention's `mask_mod`, and is evaluated on one representative tile to give the CPU tiles
their masks (`tile_mask`). The rest (`Pattern.prefix_end`, `block_keeps`, `pairs`) is geometry of this
rule; no other module writes the sink or window arithmetic (the trimmed cache's ring, kernels/cache.py,
aside).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from transformers.masking_utils import and_masks, causal_mask_function, or_masks, sliding_window_overlay

from corelens.errors import OptionError

MaskFunction = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Pattern:
    """The streaming heads' budget: `sink` tokens (S) and a `window` of recent tokens (W)."""

    sink: int
    window: int

    def __post_init__(self) -> None:
        if self.sink < 0 or self.window < 1:
            raise OptionError(f"need sink >= 0 and window >= 1, got sink={self.sink}, window={self.window}")

    def is_dense(self, n: int) -> bool:
        """Return whether the rule keeps every causal pair of an n-token prompt (no padding): n <= S + W."""
        return n <= self.sink + self.window

    def prefix_end(self, start: int, n: int) -> int:
        """Return the first query position (capped at n) whose window no longer reaches the sinks.

        Queries start .. start + S + W - 1 keep every earlier real key; past them a query keeps exactly its
        S sinks and its W window keys, the same shape for every query (what the CPU tiles exploit).
        """
        return min(n, start + self.sink + self.window)

    def window_start(self, i: int) -> int:
        """Return the first key of query position i's window (its last key is i)."""
        return i - self.window + 1


# Mask functions: (batch_idx, head_idx, q_idx, kv_idx) -> bool, as in transformers.masking_utils.


def real_key(batch_idx, head_idx, q_idx, kv_idx):
    """Keys at negative positions (the empty slots of a trimmed cache) are never attended."""
    return kv_idx >= 0


def sink_overlay(sink: int, starts: torch.Tensor | None = None) -> MaskFunction:
    """The first `sink` real keys of each row (`starts` (batch,): first real positions; None = 0)."""

    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
        first = kv_idx if starts is None else kv_idx - starts[batch_idx]
        return first < sink

    return inner_mask


def full_head_overlay(full: torch.Tensor) -> MaskFunction:
    """The heads flagged in `full` (heads,) booleans keep every key."""

    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
        return full[head_idx]

    return inner_mask


def model_overlay(model: torch.Tensor) -> MaskFunction:
    """The model's own boolean mask (batch | 1, 1, n, n) of a whole-prompt prefill."""

    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
        return model[batch_idx if model.shape[0] > 1 else 0, 0, q_idx, kv_idx]

    return inner_mask


def budget_overlay(pattern: Pattern, starts: torch.Tensor | None = None) -> MaskFunction:
    """The streaming budget: a sink, or within the window of W recent keys (the query itself included)."""
    return or_masks(sink_overlay(pattern.sink, starts), sliding_window_overlay(pattern.window))


def streaming_mask_function(pattern: Pattern, starts: torch.Tensor | None = None) -> MaskFunction:
    """The streaming rule: causal, a real key, and within the budget."""
    return and_masks(causal_mask_function, real_key, budget_overlay(pattern, starts))


def window_mask_function(pattern: Pattern) -> MaskFunction:
    """The window pass of the partitioned kernel: the streaming rule without its sinks (causal, W recent keys)."""
    return streaming_mask_function(Pattern(0, pattern.window))


def sink_pass_mask_function(pattern: Pattern) -> MaskFunction:
    """The sink pass of the partitioned kernel: query row r is position r + W; it keeps the sinks the streaming
    rule keeps and the window pass does not. With `window_mask_function` it covers the rule exactly once."""
    rule, window = streaming_mask_function(pattern), sliding_window_overlay(pattern.window)

    def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
        i = q_idx + pattern.window
        return rule(batch_idx, head_idx, i, kv_idx) & ~window(batch_idx, head_idx, i, kv_idx)

    return inner_mask


def hybrid_mask_function(
    pattern: Pattern,
    full: torch.Tensor,
    starts: torch.Tensor | None = None,
    model: torch.Tensor | None = None,
) -> MaskFunction:
    """The hybrid rule per head: causal for the `full` heads, streaming for the others; AND the model's mask."""
    budget = or_masks(full_head_overlay(full), budget_overlay(pattern, starts))
    rule = and_masks(causal_mask_function, real_key, budget)
    return rule if model is None else and_masks(rule, model_overlay(model))


def evaluate(
    mask_function: MaskFunction, q_pos: torch.Tensor, k_pos: torch.Tensor, heads: int = 1
) -> torch.Tensor:
    """Return (batch, heads, q, k) booleans of `mask_function` at query / key positions (batch, q|k)."""
    batch = q_pos.shape[0]
    b = torch.arange(batch, device=q_pos.device)[:, None, None, None]
    h = torch.arange(heads, device=q_pos.device)[None, :, None, None]
    keep = mask_function(b, h, q_pos[:, None, :, None], k_pos[:, None, None, :])
    return keep.expand(batch, heads, q_pos.shape[1], k_pos.shape[1])


def streaming_keep(
    q_pos: torch.Tensor, k_pos: torch.Tensor, starts: torch.Tensor, pattern: Pattern
) -> torch.Tensor:
    """Return (batch, q, k) booleans: the streaming rule for query positions `q_pos` (batch, q) and keys (batch, k)."""
    return evaluate(streaming_mask_function(pattern, starts), q_pos, k_pos)[:, 0]


# The model's mask.


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


# Geometry of the rule: what the tiled kernels need.


def window_keys(pattern: Pattern, i0: int, block: int) -> tuple[int, int]:
    """Return the key range [first, stop) of the windows of queries i0 .. i0 + block - 1."""
    return pattern.window_start(i0), i0 + block


@lru_cache(maxsize=64)
def tile_mask(pattern: Pattern, block: int) -> torch.Tensor:
    """Return the (block, S + W + block - 1) booleans of a tile of `block` queries past the prefix.

    Columns: the S sinks, then the window keys i0 - W + 1 .. i0 + block - 1 of the tile's first query i0
    (`window_keys`). Past the prefix the rule has the same shape for every tile, so it is evaluated once, at
    the first such tile (start 0). Raises if the rule keeps a key outside these columns: no tile path can
    silently drop part of the rule. Cached per (pattern, block): callers must not modify the tensor.
    """
    i0 = pattern.prefix_end(0, 1 << 62)
    first, stop = window_keys(pattern, i0, block)
    q_pos, k_pos = torch.arange(i0, i0 + block)[None], torch.arange(stop)[None]
    kept = evaluate(streaming_mask_function(pattern), q_pos, k_pos)[0, 0]
    cols = torch.cat([torch.arange(pattern.sink), torch.arange(first, stop)])
    if int(kept.sum()) != int(kept[:, cols].sum()):
        raise ValueError(f"the tile layout of {pattern} (block {block}) misses keys that the rule keeps")
    return kept[:, cols]


def block_keeps(
    pattern: Pattern,
    full: torch.Tensor,
    q0: torch.Tensor,
    q1: torch.Tensor,
    k0: torch.Tensor,
    k1: torch.Tensor,
    whole: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return per head and tile of queries q0..q1, keys k0..k1 (no padding) whether the rule keeps any pair
    and whether it keeps every pair (`whole`: the tile lies inside the prompt; `full` (heads,) flags)."""
    causal_any = k0 <= q1
    causal_all = (k1 <= q0) & whole
    # A streaming tile holds a kept pair iff some key is a sink or within W of some later-or-equal query ...
    stream_any = causal_any & ((k0 < pattern.sink) | ((q0 - k1).clamp(min=0) < pattern.window))
    # ... and every pair is kept iff each key is a sink or every query is within W of it.
    stream_all = causal_all & ((k1 < pattern.sink) | (q1 - k0.clamp(min=pattern.sink) < pattern.window))
    f = full[:, None, None]
    return torch.where(f, causal_any, stream_any), torch.where(f, causal_all, stream_all)


# Pair counts: the ideal speed-up.


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
