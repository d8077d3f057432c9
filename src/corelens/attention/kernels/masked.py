"""The masked streaming path (any device): each tile one sdpa call over its sinks and window under a mask.

Tile t (B queries past the prefix) copies its S sinks and its W + B - 1 window keys into one key tile; the
additive mask is the rule on that layout (`masks.tile_mask`), the same for every tile.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from corelens.attention.kernels.masks import tile_mask, window_keys
from corelens.attention.kernels.tiling import Group, Scratch, Tiles, additive


def block_size(groups: int) -> int:
    """Return the query block size B: g * B >= 768 stacked rows if B <= 128 allows (the flash kernel's large split)."""
    return int(min(128, max(32, math.ceil(768 / max(groups, 1)))))


class MaskedTiles(Tiles):
    """Each tile as one sdpa call over its sinks and W + B - 1 window keys, the rule applied by an additive mask."""

    def __init__(self, group: Group, block: int, scratch: Scratch) -> None:
        super().__init__(group, block, scratch)
        b = self.block
        first, stop = window_keys(group.pattern, self.end, b)  # the window of tile t: shifted by t B
        span = stop - first
        length = span - b + self.count * b
        dim, dim_v = self.k.shape[1], self.v.shape[1]
        kp, vp = self.padded("kp", self.k, first, length), self.padded("vp", self.v, first, length)
        self.win_k = kp.as_strided((self.count, span, dim), (b * dim, dim, 1))
        self.win_v = vp.as_strided((self.count, span, dim_v), (b * dim_v, dim_v, 1))
        self.per_call = self.chunk(self.sink + span)
        self.kt, self.vt = (
            self.keyed("k", self.k, self.sink + span),
            self.keyed("v", self.v, self.sink + span),
        )
        self.bias = additive(tile_mask(group.pattern, b).to(self.k.device), self.groups)

    def attend(self, qv: torch.Tensor, t0: int, t1: int, into=None) -> torch.Tensor:
        m, s = t1 - t0, self.sink
        self.kt[:m, 0, s:] = self.win_k[t0:t1]
        self.vt[:m, 0, s:] = self.win_v[t0:t1]
        scale = self.group.scale
        return F.scaled_dot_product_attention(qv, self.kt[:m], self.vt[:m], attn_mask=self.bias, scale=scale)


def attend(group: Group, block: int | None, scratch: Scratch) -> None:
    """Write the rows of `group` past its prefix through masked tiles of `block` queries (default `block_size`)."""
    MaskedTiles(group, block or block_size(len(group.heads)), scratch).run()
