"""The FlexAttention path: one fused kernel over all heads, with a per-head block mask of the hybrid pattern.

The default for CUDA tensors (compiled with `torch.compile`); on CPU it is what `corelens bench hybrid`
compares against. Without a padding mask the block mask is built analytically from block corners (no N x N
evaluation, so it scales to long prompts); with one, `create_block_mask` evaluates the per-position rule
including the model's mask. Inside partial blocks `mask_mod` (the rule of `masks.hybrid_mask_function`)
decides per (query, key), so the result is exact.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from corelens.attention.kernels.interface import Prefill, kernel
from corelens.attention.kernels.masks import (
    Pattern,
    allowed_mask,
    block_keeps,
    hybrid_mask_function,
    row_starts,
)

BLOCK = 128


def _grid(n: int, block: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Return per (q block, kv block) the first/last query and key positions and whether the tile is whole."""
    first = torch.arange(0, n, block, device=device)
    last = (first + block - 1).clamp(max=n - 1)
    i0, i1 = first[:, None], last[:, None]
    j0, j1 = first[None, :], last[None, :]
    whole = ((first + block) <= n)[:, None] & ((first + block) <= n)[None, :]
    return i0, i1, j0, j1, whole


def _pack(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (num_blocks, indices) of a boolean (heads, q blocks, kv blocks) grid, as BlockMask wants them."""
    counts = blocks.sum(dim=-1, dtype=torch.int32)
    order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts[None], order[None]


@lru_cache(maxsize=32)
def policy_block_mask(full: tuple[bool, ...], n: int, pattern: Pattern, device: str, block: int = BLOCK):
    """Return the BlockMask of the hybrid pattern for an unpadded n-token prompt (cached: same for each call)."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = torch.device(device)
    flags = torch.tensor(full, dtype=torch.bool, device=dev)
    any_, all_ = block_keeps(pattern, flags, *_grid(n, block, dev))
    partial = any_ & ~all_
    num, idx = _pack(partial)
    full_num, full_idx = _pack(all_)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=block,
        mask_mod=hybrid_mask_function(pattern, flags), seq_lengths=(n, n),
    )  # fmt: skip


def block_mask(
    full: torch.Tensor,
    mask: torch.Tensor | None,
    n: int,
    pattern: Pattern,
    device: torch.device,
    compile_mask: bool,
):
    """Return the BlockMask for these heads, this model mask (or None) and an n-token prefill."""
    from torch.nn.attention.flex_attention import create_block_mask

    model = allowed_mask(mask)
    if model is None:
        return policy_block_mask(tuple(bool(x) for x in full.tolist()), n, pattern, str(device))
    batch = model.shape[0]
    starts = row_starts(model, batch, device)
    mod = hybrid_mask_function(pattern, full.to(device), starts, model)
    return create_block_mask(mod, batch, len(full), n, n, device=device, _compile=compile_mask)


_COMPILED: dict[str, object] = {}


def flex_fn(compiled: bool):
    """Return flex_attention, compiled once per process when `compiled`."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "fn" not in _COMPILED:
        # Default dynamism: the first prompt length compiles static, later lengths reuse a dynamic graph
        # instead of recompiling per length (and past the recompile limit, falling back to unfused eager).
        _COMPILED["fn"] = torch.compile(flex_attention)
    return _COMPILED["fn"]


@kernel("flex")
def flex(call: Prefill, *, compiled: bool = True) -> torch.Tensor:
    """Return hybrid prefill attention (batch, n, heads, dim_v) from FlexAttention with the per-head block mask."""
    query, key, value, mask, full, pattern, scale = call
    n = query.shape[2]
    bm = block_mask(full, mask, n, pattern, query.device, compile_mask=compiled)
    gqa = query.shape[1] != key.shape[1]
    out = flex_fn(compiled)(query, key, value, block_mask=bm, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()
