"""The split streaming path (the CPU fallback): per tile two flash calls merged by their log-sum-exps.

The window keys of a tile of B queries (`masks.tile_mask`'s layout: sinks, then W + B - 1 window keys) fall
in three parts: the W - B + 1 middle keys that every query of the tile keeps, read without a mask through a
fixed-stride view of one padded copy of the keys; the B - 1 keys before them and the B - 1 after them, which
form with the sinks a small tile under an additive mask. Every query keeps at least one middle key and B - 1
edge keys, so both log-sum-exps are finite and the merge weight of the middle is sigmoid(lse_mid - lse_edge).
"""

from __future__ import annotations

import torch

from corelens.attention.kernels.masks import Pattern, tile_mask, window_keys
from corelens.attention.kernels.tiling import Group, Scratch, Tiles, additive

# Block of the split tile path: 96 keeps g * B >= 768 stacked rows for 8 heads; the block hardly matters
# (benchmarks/README.md#hybrid-kernel-constants).
SPLIT_BLOCK = 96


def split_block(window: int, block: int | None = None) -> int | None:
    """Return the block size of the split tile path for `window`, or None where it does not apply (B < 2 or B > W)."""
    b = block or min(SPLIT_BLOCK, window)
    return b if 2 <= b <= window else None


def edge_rule(pattern: Pattern, block: int) -> torch.Tensor:
    """Return the (B, S + 2 (B - 1)) booleans of a tile's edge keys: the sinks, the left and the right keys.

    Cut from `masks.tile_mask`; raises if the rule does not keep every middle key for every query.
    """
    rule = tile_mask(pattern, block)
    left, right = pattern.sink + block - 1, rule.shape[1] - (block - 1)
    if not bool(rule[:, left:right].all()):
        raise ValueError(f"the split tiles need every query of a block to keep the middle keys ({pattern})")
    return torch.cat([rule[:, :left], rule[:, right:]], dim=1)


class SplitTiles(Tiles):
    """Each tile as a middle flash call (no mask) and an edge flash call (masked), merged in place."""

    def __init__(self, group: Group, block: int, scratch: Scratch) -> None:
        super().__init__(group, block, scratch)
        b = self.block
        first, stop = window_keys(group.pattern, self.end, b)
        middle = stop - first - 2 * (b - 1)  # W - B + 1
        # One copy of the keys (values), B zero rows past n for the last tile's right keys. Tile t reads its
        # left keys at first + t B, its middle after them and its right keys after the middle.
        self.mids, self.edges = [], []
        for name, x in (("kp", self.k), ("vp", self.v)):
            dim = x.shape[1]
            xp = self.padded(name, x, 0, x.shape[0] + b)
            mid = first + b - 1
            self.mids.append(xp[mid:].as_strided((self.count, 1, middle, dim), (b * dim, 0, dim, 1)))
            left, right = (
                xp[i:].as_strided((self.count, b - 1, dim), (b * dim, dim, 1)) for i in (first, mid + middle)
            )
            self.edges.append((left, right))
        self.per_call = self.chunk(self.sink + 2 * (b - 1))
        self.et = [
            self.keyed(name, x, self.sink + 2 * (b - 1)) for name, x in (("ke", self.k), ("ve", self.v))
        ]
        self.bias = additive(edge_rule(group.pattern, b).to(self.k.device), self.groups)

    def attend(self, qv: torch.Tensor, t0: int, t1: int, into=None) -> torch.Tensor | None:
        m, s, b, scale = t1 - t0, self.sink, self.block, self.group.scale
        for t, (left, right) in zip(self.et, self.edges):
            t[:m, 0, s : s + b - 1] = left[t0:t1]
            t[:m, 0, s + b - 1 :] = right[t0:t1]
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        mid, mid_lse = flash(qv, self.mids[0][t0:t1], self.mids[1][t0:t1], 0.0, False, scale=scale)
        edge, edge_lse = flash(
            qv, self.et[0][:m], self.et[1][:m], 0.0, False, attn_mask=self.bias, scale=scale
        )
        weight = torch.sigmoid(mid_lse - edge_lse)[..., None]
        if into is None:
            return torch.lerp(edge, mid, weight)
        shape = (m, self.groups, b, edge.shape[-1])
        edge, mid, weight = edge.view(shape), mid.view(shape), weight.view(*shape[:3], 1)
        for i, view in into:
            j = i + view.shape[1]
            torch.lerp(edge[:, i:j], mid[:, i:j], weight[:, i:j], out=view)
        return None


def attend(group: Group, block: int | None, scratch: Scratch) -> None:
    """Write the rows of `group` past its prefix through split tiles (CPU; `split_block` must apply)."""
    b = split_block(group.pattern.window, block)
    if b is None:
        raise ValueError(f"the split tiles need 2 <= block <= window (block {block}, {group.pattern})")
    SplitTiles(group, b, scratch).run(direct=group.out.dtype == torch.float32)
