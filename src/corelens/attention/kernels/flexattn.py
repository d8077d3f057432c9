"""The FlexAttention path: one fused kernel over all heads, with a per-head block mask of the hybrid pattern.

The default for CUDA tensors (compiled with `torch.compile`); on CPU it is what `corelens bench hybrid`
compares against. Without a padding mask the block mask is built analytically from block corners (no N x N
evaluation, so it scales to long prompts); with one, `create_block_mask` evaluates the per-position rule
including the model's mask. Inside partial blocks `mask_mod` decides per (query, key), so the result is exact.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from corelens.attention.kernels.semantics import allowed_mask, row_starts

BLOCK = 128


def _mask_mod(
    full: torch.Tensor, starts: torch.Tensor | None, model: torch.Tensor | None, sink: int, window: int
):
    """Return the per-position rule as a FlexAttention mask_mod (starts None: no padding, sinks from 0)."""

    def mask_mod(b, h, q, k):
        first = k if starts is None else k - starts[b]
        keep = (k <= q) & (full[h] | (first < sink) | (q - k < window))
        return keep & model[b, 0, q, k] if model is not None else keep

    return mask_mod


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
def policy_block_mask(
    full: tuple[bool, ...], n: int, sink: int, window: int, device: str, block: int = BLOCK
):
    """Return the BlockMask of the hybrid pattern for an unpadded n-token prompt (cached: same for each call)."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = torch.device(device)
    flags = torch.tensor(full, dtype=torch.bool, device=dev)
    i0, i1, j0, j1, whole = _grid(n, block, dev)
    causal_any = j0 <= i1
    causal_all = (j1 <= i0) & whole
    # A streaming tile holds a kept pair iff some key is a sink or within W of some later-or-equal query.
    stream_any = causal_any & ((j0 < sink) | ((i0 - j1).clamp(min=0) < window))
    # ... and every pair is kept iff each key is a sink or every query is within W of it.
    stream_all = causal_all & ((j1 < sink) | (i1 - j0.clamp(min=sink) < window))
    f = flags[:, None, None]
    any_ = torch.where(f, causal_any, stream_any)
    all_ = torch.where(f, causal_all, stream_all)
    partial = any_ & ~all_
    num, idx = _pack(partial)
    full_num, full_idx = _pack(all_)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=block,
        mask_mod=_mask_mod(flags, None, None, sink, window), seq_lengths=(n, n),
    )  # fmt: skip


def block_mask(
    full: torch.Tensor,
    mask: torch.Tensor | None,
    n: int,
    sink: int,
    window: int,
    device: torch.device,
    compile_mask: bool,
):
    """Return the BlockMask for these heads, this model mask (or None) and an n-token prefill."""
    from torch.nn.attention.flex_attention import create_block_mask

    model = allowed_mask(mask)
    if model is None:
        return policy_block_mask(tuple(bool(x) for x in full.tolist()), n, sink, window, str(device))
    batch = model.shape[0]
    starts = row_starts(model, batch, device)
    mod = _mask_mod(full.to(device), starts, model, sink, window)
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


def flex(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    full: torch.Tensor,
    sink: int,
    window: int,
    scale: float,
    *,
    compiled: bool = True,
) -> torch.Tensor:
    """Return hybrid prefill attention (batch, n, heads, dim_v) from FlexAttention with the per-head block mask."""
    n = query.shape[2]
    bm = block_mask(full, mask, n, sink, window, query.device, compile_mask=compiled)
    gqa = query.shape[1] != key.shape[1]
    out = flex_fn(compiled)(query, key, value, block_mask=bm, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()
