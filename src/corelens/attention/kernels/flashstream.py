"""The streaming heads as flash-attention calls and one fused merge: `partitioned(stream="flash")`.

The second candidate for the streaming heads on CUDA (issue 41, beside the Triton kernel of `stream.py`; the
GPU run measures both and `--kernel auto` keeps the faster, `crossover.Crossover.stream`). Per streaming call
of a layer's layout (q, k, v in flash's (batch, n, heads, dim) layout, GQA as consecutive query heads per KV
head), for the rule of `masks.py` (query i keeps key j iff j <= i and (j < S or i - j < W)):

- the window pass: one causal call with a left window, so flash skips every key block outside all rows'
  windows (`flash_args`: window_size_left = W - 1);
- the sink pass, aligned top-left: queries W .. n - 1 (row r = i - W) over the first s = min(S, n - W) keys,
  row r keeping sink j iff j <= r. Flash aligns the causal mask of a call with fewer keys than queries to the
  bottom right (row r would keep j <= r + s - rows), so the pass is two calls: its first s rows as a square
  causal call (where the two alignments agree) and the other rows over all s sinks with no mask;
- the merge: rows i >= W of the window output take the sink output with weight sigmoid(lse_sink - lse_window),
  one Triton kernel per sink call, in place (`merge_`; torch ops on a CPU without Triton's interpreter).

The two passes keep disjoint keys (the sink pass only j <= i - W), so the merge is exact. The windowed-attention
primitive is a parameter (`Windowed`): on CUDA `flash_windowed`, a thin adapter over
`torch.ops.aten._flash_attention_forward` (fp16 / bf16 only); elsewhere `reference_windowed`, the same
contract computed densely (tests and dry runs: exact, O(n^2) memory, not a fast path).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import torch

from corelens.attention.kernels import stream as triton_stream
from corelens.attention.kernels.masks import Pattern

try:  # the merge's body names `tl`; without Triton the torch merge runs
    import triton.language as tl
except ImportError:  # pragma: no cover - Triton ships with torch's Linux wheels
    tl = None

# (q, k, v, *, causal, window, scale) -> (out, lse): q (batch, nq, heads, dim), k and v (batch, nk, kv_heads,
# dim) with query head h over KV head h // (heads // kv_heads); `causal` (nq == nk): key j <= query i;
# `window` (with causal; None: none): also i - j < window; out (batch, nq, heads, dim_v) in q's dtype and lse
# (batch, heads, nq), the natural log-sum-exp of each row's scaled scores, in float32 (float64 stays float64).
Windowed = Callable[..., tuple[torch.Tensor, torch.Tensor]]

BLOCK_ROWS = 32  # the merge's rows per program


# What flash-attention's operator raises where this torch build cannot run a call (no kernel for the device,
# dtype or window): the flash path is then no candidate on this machine, said so, not a failed parity.
REFUSALS = (RuntimeError, NotImplementedError)


def refusal(err: BaseException) -> str:
    """Return one line naming why the flash operator refused (the first line of its message, bounded)."""
    text = str(err).splitlines()[0][:160] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def sink_calls(n: int, pattern: Pattern) -> list[tuple[slice, bool]]:
    """Return the sink pass's calls over an n-token prompt: (query rows, causal), empty where no row reaches a sink.

    Examples:
        >>> sink_calls(20, Pattern(4, 8))
        [(slice(8, 12, None), True), (slice(12, None, None), False)]
        >>> sink_calls(10, Pattern(4, 8)), sink_calls(8, Pattern(4, 8))
        ([(slice(8, 10, None), True)], [])
    """
    w = pattern.window
    s = min(pattern.sink, n - w)  # row i - W keeps the sinks j <= i - W: at most n - W of them
    if s <= 0:
        return []
    # The first s rows: a square causal call (top-left = bottom-right alignment there); every later row keeps
    # all s sinks: no mask.
    return [(slice(w, w + s), True)] + ([(slice(w + s, None), False)] if n - w > s else [])


def flash_args(q, k, v, *, causal: bool, window: int | None, scale: float) -> tuple[tuple, dict]:
    """Return the positional and keyword arguments of `aten._flash_attention_forward` for one call.

    Examples:
        >>> q = torch.zeros(1, 10, 4, 8)
        >>> args, kwargs = flash_args(q, q[:, :, :2], q[:, :, :2], causal=True, window=3, scale=0.5)
        >>> args[3:], kwargs
        ((None, None, 10, 10, 0.0, True, False), {'scale': 0.5, 'window_size_left': 2, 'window_size_right': 0})
    """
    if window is not None and not causal:
        raise ValueError("a window needs causal=True (the rule's window ends at the query)")
    # Flash keeps key j for query i iff i + nk - nq - left <= j <= i + nk - nq + right (nq == nk here: i - left
    # <= j <= i + right); our rule keeps i - j < W, i.e. j >= i - (W - 1): left = W - 1, right = 0 (causal). A
    # left window reaching past the first key is no window (flash turns it into -1 itself). None: no window.
    left, right = (None, None) if window is None else (window - 1, 0)
    # No cumulative lengths (the dense batch path), max lengths as the sizes, no dropout, no debug mask.
    positional = (q, k, v, None, None, q.shape[1], k.shape[1], 0.0, causal, False)
    return positional, {"scale": scale, "window_size_left": left, "window_size_right": right}


def _flash_op():
    """Return flash-attention's forward operator (a function, so that a CPU test can put a stand-in here)."""
    return torch.ops.aten._flash_attention_forward


def flash_windowed(q, k, v, *, causal: bool, window: int | None, scale: float):
    """Return (out, lse) of flash-attention on CUDA (`Windowed`): fp16 / bf16, last dimensions contiguous."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(
            f"stream='flash' runs flash-attention, which takes float16 / bfloat16, not {q.dtype}; "
            "use stream='triton' or 'flex'"
        )
    args, kwargs = flash_args(q, k, v, causal=causal, window=window, scale=scale)
    out, lse, *_ = _flash_op()(*args, **kwargs)
    return out, lse[..., : q.shape[1]]


def reference_windowed(q, k, v, *, causal: bool, window: int | None, scale: float):
    """Return (out, lse) of the same contract computed densely (`Windowed`; any device, any float dtype)."""
    if window is not None and not causal:
        raise ValueError("a window needs causal=True (the rule's window ends at the query)")
    acc = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2).to(acc)
    kh, vh = (x.transpose(1, 2).to(acc).repeat_interleave(group, 1) for x in (k, v))
    scores = qh @ kh.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(q.shape[1], device=q.device)[:, None]
        j = torch.arange(k.shape[1], device=q.device)[None, :]
        keep = (j <= i) & ((i - j < window) if window is not None else True)
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = scores.logsumexp(-1)
    out = (scores - lse[..., None]).exp() @ vh
    return out.transpose(1, 2).to(q.dtype), lse


def default_windowed(device: torch.device) -> Windowed:
    """Return the windowed primitive of `device`: flash-attention on CUDA, the dense reference elsewhere."""
    return flash_windowed if device.type == "cuda" else reference_windowed


def _merge_body(
    OUT, L, S, LS, rows_n,
    so_b, so_n, so_h, sl_b, sl_h, sl_n, ss_b, ss_n, ss_h, sls_b, sls_h, sls_n,
    DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, F64: tl.constexpr,
):  # fmt: skip
    pid, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    live = rows < rows_n
    both = live[:, None] & (d[None, :] < DV)
    lse = tl.load(L + b * sl_b + h * sl_h + rows * sl_n, mask=live, other=0.0)
    lse_s = tl.load(LS + b * sls_b + h * sls_h + rows * sls_n, mask=live, other=0.0)
    o_ptr = OUT + b * so_b + h * so_h + rows[:, None] * so_n + d[None, :]
    o = tl.load(o_ptr, mask=both, other=0.0)
    s = tl.load(S + b * ss_b + h * ss_h + rows[:, None] * ss_n + d[None, :], mask=both, other=0.0)
    if F64:
        w = 1.0 / (1.0 + tl.exp(lse.to(tl.float64) - lse_s.to(tl.float64)))
        merged = o.to(tl.float64) + w[:, None] * (s.to(tl.float64) - o.to(tl.float64))
    else:
        w = tl.sigmoid(lse_s.to(tl.float32) - lse.to(tl.float32))
        merged = o.to(tl.float32) + w[:, None] * (s.to(tl.float32) - o.to(tl.float32))
    tl.store(o_ptr, merged.to(OUT.dtype.element_ty), mask=both)


@lru_cache(maxsize=1)
def _merge_kernel():
    import triton

    return triton.jit(_merge_body)


def merge_torch(out, lse, other, other_lse) -> None:
    """The merge of `merge_` in torch ops (several kernels): the CPU's path without Triton's interpreter."""
    acc = torch.promote_types(out.dtype, torch.float32)
    weight = torch.sigmoid(other_lse.to(acc) - lse.to(acc)).transpose(1, 2)[..., None]
    out.copy_(out.to(acc).lerp_(other.to(acc), weight))


def merge_(out, lse, other, other_lse) -> None:
    """Merge two exact passes over disjoint keys into `out`, in place, by their log-sum-exps.

    out, other (batch, rows, heads, dim_v) (last dimension contiguous; any other strides); lse, other_lse
    (batch, heads, rows): out <- out + sigmoid(other_lse - lse) (other - out), in float32 (float64 stays
    float64). One Triton kernel on CUDA and under Triton's interpreter; torch ops elsewhere.
    """
    batch, rows, heads, dim = out.shape
    if rows == 0:
        return
    if out.device.type != "cuda" and not (triton_stream.available() and triton_stream.interpreting()):
        merge_torch(out, lse, other, other_lse)
        return
    if out.stride(-1) != 1 or other.stride(-1) != 1:
        raise ValueError("merge_ needs outputs whose last dimension is contiguous")
    grid = (math.ceil(rows / BLOCK_ROWS), heads, batch)
    _merge_kernel()[grid](
        out, lse, other, other_lse, rows,
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), lse.stride(2),
        other.stride(0), other.stride(1), other.stride(2),
        other_lse.stride(0), other_lse.stride(1), other_lse.stride(2),
        DV=dim, BLOCK_R=BLOCK_ROWS, BLOCK_D=max(16, 1 << (dim - 1).bit_length()), F64=out.dtype == torch.float64,
    )  # fmt: skip


def streaming(q, k, v, pattern: Pattern, scale: float, windowed: Windowed | None = None) -> torch.Tensor:
    """Return the streaming rule's attention (batch, heads, n, dim_v) of q over k, v (batch, heads, n, dim).

    GQA as in `Windowed` (query head h over KV head h // (heads // kv_heads)). `windowed`: the primitive
    (default `default_windowed` of q's device).
    """
    windowed = windowed or default_windowed(q.device)
    qf, kf, vf = (x.transpose(1, 2) for x in (q, k, v))  # flash's (batch, n, heads, dim): views, no copy
    n, w = q.shape[2], pattern.window
    out, lse = windowed(qf, kf, vf, causal=True, window=w, scale=scale)
    s = min(pattern.sink, n - w)
    for rows, causal in sink_calls(n, pattern):
        other, other_lse = windowed(
            qf[:, rows], kf[:, :s], vf[:, :s], causal=causal, window=None, scale=scale
        )
        merge_(out[:, rows], lse[..., rows], other, other_lse)
    return out.transpose(1, 2)
