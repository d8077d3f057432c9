"""The streaming heads in one Triton kernel: sinks and window in one online softmax, no second pass, no merge.

One program per (query tile, streaming head, batch row). The tile walks its key tiles once: first the sink
keys that no row of the tile reaches through its window (keys start .. start + S - 1 with j <= i - W), then
the window keys max(start, i0 - W + 1) .. i1 (i0, i1: the tile's first and last query). The two ranges are
disjoint, so each kept pair is counted once and there is nothing to merge. Only the tiles that cut the rule
are masked: the last sink tile, the far-edge window tiles (some row's window starts inside them) and the
diagonal tiles (some key lies after some query); every other tile is read without a mask.

GQA: a table maps each program's query head to its KV head (`heads`, `kv_heads`), so any head set runs in one
launch and each KV head is read in place. Left padding: `starts` (batch,) is each row's first real token; its
sinks are counted from there (masks.py) and the padding rows come out as zeros. The output is written straight
into the model's (batch, n, heads, dim) tensor, in the query heads' slices.

On CUDA it is compiled; CPU tensors run under Triton's interpreter (numpy, exact, slow: the tests' path), which
TRITON_INTERPRET=1 must select before triton is imported (tests/conftest.py sets it). `available()` says
whether Triton imports.

"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from corelens.attention.kernels.masks import Pattern

try:  # the kernel's body names `tl`; without Triton `available()` is False and nothing calls it
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton ships with torch's Linux wheels
    tl = None

# Tile sizes on CUDA: 64 queries x 64 keys; head dims up to 128 in 4 warps (128 keeps 8 in flight).
BLOCK_M = 64
BLOCK_N = 64


def available() -> bool:
    """Return whether Triton imports (it ships with torch's CUDA wheels on Linux)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        return False
    return True


def _body(
    Q, K, V, OUT, HEADS, KV_HEADS, STARTS,
    n, sink, window, qk_scale,
    sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_n, so_h,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, F32: tl.constexpr,
):  # fmt: skip
    pid_m, pid_h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = tl.load(HEADS + pid_h)
    kvh = tl.load(KV_HEADS + pid_h)
    start = tl.load(STARTS + b)
    m0 = pid_m * BLOCK_M
    m_last = tl.minimum(m0 + BLOCK_M, n) - 1
    rows = m0 + tl.arange(0, BLOCK_M)
    d, dv, cols0 = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV), tl.arange(0, BLOCK_N)
    q = tl.load(
        Q + b * sq_b + h * sq_h + rows[:, None] * sq_n + d[None, :],
        mask=(rows[:, None] < n) & (d[None, :] < D),
        other=0.0,
    )
    kb, vb = K + b * sk_b + kvh * sk_h, V + b * sv_b + kvh * sv_h
    # Sinks past every row's window: keys start .. sink_hi - 1; the first `sink_full` of them kept by every row.
    sink_hi = tl.maximum(tl.minimum(start + sink, m_last - window + 1), start)
    sink_full = start + tl.maximum(tl.minimum(sink, m0 - window + 1 - start), 0) // BLOCK_N * BLOCK_N
    n_sink = tl.cdiv(sink_hi - start, BLOCK_N)
    # Window keys lo .. m_last; tiles from lo, unmasked from edge_end (every row's window reaches the tile)
    # up to full_end (the tile ends at or before the first row: causal for all).
    lo = tl.maximum(start, m0 - window + 1)
    hi = tl.maximum(m_last + 1, lo)
    edge_end = lo + tl.cdiv(tl.maximum(m_last - window + 1 - lo, 0), BLOCK_N) * BLOCK_N
    full_end = edge_end + tl.maximum(m0 + 1 - edge_end, 0) // BLOCK_N * BLOCK_N
    n_tiles = n_sink + tl.cdiv(hi - lo, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for t in range(0, n_tiles):
        is_sink = t < n_sink
        n0 = tl.where(is_sink, start + t * BLOCK_N, lo + (t - n_sink) * BLOCK_N)
        cols = n0 + cols0
        k = tl.load(
            kb + cols[None, :] * sk_n + d[:, None], mask=(cols[None, :] < n) & (d[:, None] < D), other=0.0
        )
        if F32:
            qk = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee") * qk_scale
        elif IEEE:
            qk = tl.dot(q, k, input_precision="ieee") * qk_scale
        else:
            qk = tl.dot(q, k) * qk_scale
        cut_sink = is_sink & (n0 + BLOCK_N > sink_full)
        cut_window = (t >= n_sink) & ((n0 < edge_end) | (n0 + BLOCK_N > full_end))
        if cut_sink | cut_window:  # only the tiles that cut the rule pay for a mask
            r, c = rows[:, None], cols[None, :]
            in_sink = (c < start + sink) & (c <= r - window)
            in_window = (c <= r) & (r - c < window)
            keep = tl.where(is_sink, in_sink, in_window) & (c < n)
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing kept yet stays at zero
        p = tl.exp2(qk - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        v = tl.load(
            vb + cols[:, None] * sv_n + dv[None, :], mask=(cols[:, None] < n) & (dv[None, :] < DV), other=0.0
        )
        l_i = l_i * alpha + tl.sum(p, 1)
        p16 = p.to(v.dtype)  # the probabilities in the values' precision, as flash attention rounds them
        if F32:  # the interpreter's 16-bit dot is wrong: the same rounded operands, multiplied in fp32
            pv = tl.dot(p16.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        elif IEEE:
            pv = tl.dot(p16, v, input_precision="ieee")
        else:
            pv = tl.dot(p16, v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows keep nothing: zeros
    tl.store(
        OUT + b * so_b + h * so_h + rows[:, None] * so_n + dv[None, :],
        acc.to(OUT.dtype.element_ty),
        mask=(rows[:, None] < n) & (dv[None, :] < DV),
    )


@lru_cache(maxsize=1)
def _kernel():
    """Return the kernel, compiled by Triton's JIT (or interpreted where TRITON_INTERPRET=1 was set first)."""
    import triton

    return triton.jit(_body)


def interpreting() -> bool:
    """Return whether Triton runs kernels under its interpreter (TRITON_INTERPRET=1 before its import)."""
    import triton.language as lang
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(lang.standard.sum, InterpretedFunction)


def _pow2(x: int) -> int:
    return max(16, 1 << (x - 1).bit_length())


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def streaming_into(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads,
    kv_heads,
    starts,
    pattern: Pattern,
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
) -> None:
    """Write the streaming rule's attention of query heads `heads` into out (batch, n, heads, dim_v), in place.

    q (batch, heads, n, dim) and k, v (batch, kv_heads, n, dim) in any layout with a contiguous last dimension
    (else a copy); `kv_heads[i]`: the KV head of query head `heads[i]`; `starts` (batch,): each row's first
    real token (None: 0). `block_m`, `block_n`: the tile sizes (powers of two >= 16; default `BLOCK_M`,
    `BLOCK_N`).
    """
    batch, _, n, dim = q.shape
    device = q.device
    heads = torch.as_tensor(heads, dtype=torch.int32, device=device)
    kv_heads = torch.as_tensor(kv_heads, dtype=torch.int32, device=device)
    if heads.numel() == 0 or n == 0:
        return
    starts = torch.zeros(batch, dtype=torch.int32, device=device) if starts is None else starts
    starts = torch.as_tensor(starts, device=device).to(torch.int32)
    if out.stride(-1) != 1:
        raise ValueError("streaming_into writes into an output whose last dimension is contiguous")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            "the Triton streaming kernel runs CPU tensors only under Triton's interpreter: set TRITON_INTERPRET=1 "
            "before anything imports triton"
        )
    q, k, v = (_last_contiguous(x) for x in (q, k, v))
    bm, bn = block_m or BLOCK_M, block_n or BLOCK_N
    grid = (math.ceil(n / bm), heads.numel(), batch)
    _kernel()[grid](
        q, k, v, out, heads, kv_heads, starts,
        n, pattern.sink, pattern.window, scale * math.log2(math.e),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=dim, DV=v.shape[-1], BLOCK_D=_pow2(dim), BLOCK_DV=_pow2(v.shape[-1]),
        BLOCK_M=bm, BLOCK_N=bn, IEEE=q.dtype == torch.float32,
        F32=device.type != "cuda" and q.dtype != torch.float32,
    )  # fmt: skip
