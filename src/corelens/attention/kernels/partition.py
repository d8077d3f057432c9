"""The partitioned path (the CUDA design): full heads through sdpa, streaming heads in one Triton kernel or two passes.

On CUDA (`stream="triton"`, the default where Triton imports) the full heads of a layer run as ONE stock causal
sdpa call (`one_call`: a KV-granular set over its KV heads with GQA, a query-granular one over its KV heads
gathered per query head), on whatever backend sdpa picks for the stock model, and every streaming head of every
batch row runs in one launch of the Triton kernel (`stream.py`: sinks and window in one online softmax, written
into the output slices). The rest of this docstring is the FlexAttention path (`stream="flex"`, any device).

The query heads are partitioned once per head set (`layout`, cached): the full heads run as stock causal sdpa
on their own heads, and the streaming heads run the rule of `masks.py` (docs/methods.md#hybrid) as two exact
passes merged by their log-sum-exps:

- the window pass: causal attention over the W most recent keys (`masks.window_mask_function`), one
  FlexAttention call with ONE block mask shared by every head and batch row;
- the sink pass: the rows i >= W over the S sink keys that their window does not reach (j <= i - W,
  `masks.sink_pass_mask_function`), a small FlexAttention call over the first S keys.

Each row of the sink pass (i >= W) keeps key 0 and each window row keeps its query, so both log-sum-exps are
finite and the merge weight of the sinks is sigmoid(lse_sink - lse_window). The two block masks are built
analytically from block corners (no N x N evaluation) and cached per (n, pattern, device), never per layer.

Heads: each pass groups its query heads by KV head; the KV heads with the same number c of members in the
pass form one call of c x (their count) query heads over their KV heads (GQA without repeating keys: each
KV head is read once for its c members, never copied per query head). A call whose query heads are
consecutive reads them as a view. Any other call is split, once per head set (`Call.runs`, cached with the
layout: the permutation of its heads into contiguous runs), into one call per maximal run of consecutive
query heads on one KV head (whole consecutive KV heads merge into one run), each q, k, v a view and each
output written into its slice: no copy. A copy remains only where a call would split into more than
`MAX_RUNS` runs (heads scattered one by one): there one `index_select` of the query heads (O(n d) per head,
against the O(n^2 d) attention) and of the KV heads replaces many small launches (and, for the streaming
pass, a FlexAttention compile per distinct head count), and an `index_copy_` writes the output.
Masks: None (causal) and causal with left padding (each batch row runs from its first real token; padding
rows output zeros); any other model mask takes the blocked kernel's exact dense path.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from corelens.attention.kernels import crossover, flashstream
from corelens.attention.kernels import stream as triton_stream
from corelens.attention.kernels.flexattn import BLOCK, _grid, _pack, flex_fn
from corelens.attention.kernels.interface import Prefill, kernel
from corelens.attention.kernels.masks import (
    Pattern,
    allowed_mask,
    block_keeps,
    ideal_speedup,
    sink_pass_mask_function,
    window_mask_function,
)
from corelens.attention.kernels.tiles import Padding, Plans, blocked

# How the streaming heads run (`partitioned(stream=...)`): "triton", one kernel with the sinks inside
# (`stream.py`, the CUDA default where Triton imports), "flash", flash-attention's left window plus a top-left
# sink pass and one fused merge (`flashstream.py`; CUDA in fp16 / bf16, the dense reference elsewhere), or
# "flex", a window and a sink FlexAttention pass merged by their log-sum-exps (`streaming` below; any device).
STREAMS = ("triton", "flex", "flash")

# A call whose heads split into more runs than this gathers them instead (module docstring, "Heads").
MAX_RUNS = 8


@dataclass(frozen=True)
class Run:
    """Consecutive query heads [q0, q1) over consecutive KV heads [kv0, kv1), `members` per KV head: all views."""

    q0: int
    q1: int
    kv0: int
    kv1: int
    members: int


@dataclass(frozen=True)
class Call:
    """One attention call of a pass: query heads `q` (KV-major, `members` per KV head) over the KV heads `kv`."""

    q: torch.Tensor
    kv: torch.Tensor
    members: int
    q_run: tuple[int, int] | None  # (first, stop) when the query heads are consecutive: read as a view
    kv_run: tuple[int, int] | None
    # When q is not consecutive: the same heads as contiguous runs (each read in place), or () to gather.
    runs: tuple[Run, ...] = ()


def _run(idx: list[int]) -> tuple[int, int] | None:
    return (idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else None


def _split(heads: list[list[int]], kv: list[int], group: int) -> tuple[Run, ...]:
    """Return the query heads of KV heads `kv` as maximal runs of consecutive heads, or () past `MAX_RUNS`."""
    runs: list[Run] = []
    for j in kv:
        for h in heads[j]:
            last = runs[-1] if runs else None
            if last and last.kv1 == j + 1 and last.q1 == h:  # the next head of the same KV head's run
                runs[-1] = Run(last.q0, h + 1, last.kv0, last.kv1, last.members + 1)
            elif last and last.members == group and len(heads[j]) == group and last.q1 == h:
                runs[-1] = Run(last.q0, h + group, last.kv0, j + 1, group)  # whole consecutive KV heads
                break
            else:
                runs.append(Run(h, h + 1, j, j + 1, 1))
    return tuple(runs) if len(runs) <= MAX_RUNS else ()


def _calls(heads: list[list[int]], group: int, device: torch.device) -> tuple[Call, ...]:
    """Return the calls of one pass from its query heads per KV head (`heads[j]`: the members of KV head j)."""
    calls = []
    for count in sorted({len(m) for m in heads if m}):
        kv = [j for j, m in enumerate(heads) if len(m) == count]
        q = [h for j in kv for h in heads[j]]
        q_run = _run(q)
        calls.append(
            Call(
                torch.tensor(q, device=device), torch.tensor(kv, device=device), count, q_run, _run(kv),
                () if q_run else _split(heads, kv, group),
            )
        )  # fmt: skip
    return tuple(calls)


@lru_cache(maxsize=256)
def layout(full: tuple[bool, ...], kv_heads: int, device: str) -> tuple[tuple[Call, ...], tuple[Call, ...]]:
    """Return the (full, streaming) calls of a head set (cached per head set: computed once, not per call)."""
    groups = len(full) // kv_heads
    members = [range(j * groups, (j + 1) * groups) for j in range(kv_heads)]
    dev = torch.device(device)
    return (
        _calls([[h for h in m if full[h]] for m in members], groups, dev),
        _calls([[h for h in m if not full[h]] for m in members], groups, dev),
    )


def _take(x: torch.Tensor, idx: torch.Tensor, run: tuple[int, int] | None) -> torch.Tensor:
    """Return heads `idx` of x (batch, heads, n, dim): a view for a run of consecutive heads, else a copy."""
    return x[:, run[0] : run[1]] if run else x.index_select(1, idx)


def _put(out: torch.Tensor, call: Call, o: torch.Tensor) -> None:
    """Write a call's output o (batch, heads, n, dim) into its heads of `out` (batch, n, all heads, dim)."""
    o = o.transpose(1, 2)
    if call.q_run:
        out[:, :, call.q_run[0] : call.q_run[1]] = o
    else:
        out.index_copy_(2, call.q, o.to(out.dtype))


def _from_blocks(any_: torch.Tensor, all_: torch.Tensor, mask_mod, q_len: int, kv_len: int, block: int):
    from torch.nn.attention.flex_attention import BlockMask

    num, idx = _pack(any_ & ~all_)
    full_num, full_idx = _pack(all_)
    return BlockMask.from_kv_blocks(
        num, idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
        seq_lengths=(q_len, kv_len),
    )  # fmt: skip


@lru_cache(maxsize=16)
def window_block_mask(n: int, pattern: Pattern, device: str, block: int = BLOCK):
    """Return the block mask of the window pass over an n-token prompt: one for all heads and batch rows."""
    dev = torch.device(device)
    window = Pattern(0, pattern.window)  # the rule without sinks: causal, the W most recent keys
    any_, all_ = block_keeps(window, torch.zeros(1, dtype=torch.bool, device=dev), *_grid(n, block, dev))
    return _from_blocks(any_, all_, window_mask_function(pattern), n, n, block)


@lru_cache(maxsize=16)
def sink_block_mask(n: int, pattern: Pattern, device: str, block: int = BLOCK):
    """Return the block mask of the sink pass: queries W .. n - 1 (rows i - W) over the S sink keys."""
    dev = torch.device(device)
    rows = n - pattern.window
    sink = min(
        pattern.sink, rows
    )  # row r (query r + W) keeps sink j iff j <= r: causal on the (rows, S) grid
    q0 = torch.arange(0, rows, block, device=dev)[:, None]
    k0 = torch.arange(0, sink, block, device=dev)[None, :]
    q1, k1 = (q0 + block - 1).clamp(max=rows - 1), (k0 + block - 1).clamp(max=sink - 1)
    whole = (q0 + block <= rows) & (k0 + block <= sink)
    any_, all_ = block_keeps(pattern, torch.ones(1, dtype=torch.bool, device=dev), q0, q1, k0, k1, whole)
    return _from_blocks(any_, all_, sink_pass_mask_function(pattern), rows, sink, block)


# Compiled variants the two passes may need in one process: window / sink pass x the head counts of a
# layout's calls x GQA on / off. Past dynamo's recompile limit (8 by default) a call would run FlexAttention
# unfused (N x N scores), so the limit is raised to this once, the first time a compiled pass runs.
RECOMPILE_LIMIT = 64


def _allow_recompiles() -> None:
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))


def _flex_lse(q, k, v, block_mask, scale: float, compiled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return FlexAttention's output and its log-sum-exp (natural log) under `block_mask`."""
    gqa = q.shape[1] != k.shape[1]
    if compiled:
        _allow_recompiles()
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9: the older keyword
        return flex_fn(compiled)(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_lse=True)
    out, aux = flex_fn(compiled)(
        q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa, return_aux=AuxRequest(lse=True)
    )
    return out, aux.lse


def streaming(q, k, v, pattern: Pattern, scale: float, compiled: bool) -> torch.Tensor:
    """Return the streaming rule's attention of q over k, v (batch, heads, n, dim): window + sinks, merged."""
    n = q.shape[2]
    device = str(q.device)
    out, lse = _flex_lse(q, k, v, window_block_mask(n, pattern, device), scale, compiled)
    w = pattern.window
    s = min(pattern.sink, n - w)  # row i - W keeps the sinks j <= i - W: at most n - W of them
    if s <= 0:  # no row reaches past its window to a sink
        return out
    rows = (slice(None), slice(None), slice(w, None))
    sink, sink_lse = _flex_lse(
        q[rows], k[:, :, :s], v[:, :, :s], sink_block_mask(n, pattern, device), scale, compiled
    )
    acc = torch.promote_types(out.dtype, torch.float32)  # merge in fp32 (fp64 stays fp64)
    weight = torch.sigmoid(sink_lse.to(acc) - lse[rows].to(acc))[..., None]
    out[rows] = out[rows].to(acc).lerp_(sink.to(acc), weight).to(out.dtype)
    return out


def _full(q, k, v, scale: float, members: int) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=members > 1)


def _each(query, key, value, out, calls: tuple[Call, ...], attend) -> None:
    """Run `attend(q, k, v, members)` for each call, on views of its runs where the layout has them."""
    for call in calls:
        for run in call.runs:  # a scattered set as contiguous runs: views in, slices out, no copy
            q, k, v = query[:, run.q0 : run.q1], key[:, run.kv0 : run.kv1], value[:, run.kv0 : run.kv1]
            out[:, :, run.q0 : run.q1] = attend(q, k, v, run.members).transpose(1, 2)
        if call.runs:
            continue
        q, k, v = (
            _take(query, call.q, call.q_run),
            _take(key, call.kv, call.kv_run),
            _take(value, call.kv, call.kv_run),
        )
        _put(out, call, attend(q, k, v, call.members))


@lru_cache(maxsize=256)
def stream_table(full: tuple[bool, ...], kv_heads: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the streaming query heads of a head set and the KV head of each (the Triton kernel's table)."""
    groups = len(full) // kv_heads
    heads = [h for h, f in enumerate(full) if not f]
    dev = torch.device(device)
    return (
        torch.tensor(heads, dtype=torch.int32, device=dev),
        torch.tensor([h // groups for h in heads], dtype=torch.int32, device=dev),
    )


@lru_cache(maxsize=256)
def one_call(full: tuple[bool, ...], kv_heads: int, device: str) -> Call | None:
    """Return the full heads of a head set as ONE sdpa call (None: no full head).

    KV-granular (every query head of a kept KV head is full): the full query heads over their KV heads, GQA
    inside the call. Otherwise (query-granular): each full query head over its own KV head (the KV heads
    gathered once per query head: O(n d) per head against the call's O(n^2 d)). Consecutive heads are views.
    """
    groups = len(full) // kv_heads
    heads = [h for h, f in enumerate(full) if f]
    if not heads:
        return None
    kvs = sorted({h // groups for h in heads})
    whole = all(full[j * groups + i] for j in kvs for i in range(groups))
    kv = kvs if whole else [h // groups for h in heads]
    dev = torch.device(device)
    return Call(
        torch.tensor(heads, device=dev), torch.tensor(kv, device=dev), groups if whole else 1, _run(heads), _run(kv)
    )  # fmt: skip


def _rows(
    query,
    key,
    value,
    out,
    full: tuple[bool, ...],
    pattern: Pattern,
    scale: float,
    compiled: bool,
    stream: str,
    full_call: str,
    side: bool = False,
    windowed=None,
) -> None:
    """Write hybrid attention of an unpadded prompt (batch, heads, n, dim) into `out` (batch, n, heads, dim);
    the streaming heads only where `stream` is "flex" or "flash" (the Triton kernel runs them for the whole
    batch). `side`: the full heads on the second CUDA stream (`two_streams`)."""
    full_calls, stream_calls = layout(full, key.shape[1], str(query.device))
    with _on_side(query.device) if side else nullcontext():
        if full_call == "one":
            call = one_call(full, key.shape[1], str(query.device))
            if call is not None:
                q, k, v = (_take(x, i, r) for x, i, r in ((query, call.q, call.q_run), (key, call.kv, call.kv_run),
                                                          (value, call.kv, call.kv_run)))  # fmt: skip
                _put(out, call, _full(q, k, v, scale, call.members))
        else:
            _each(query, key, value, out, full_calls, lambda q, k, v, m: _full(q, k, v, scale, m))
    if stream == "flex":
        _each(
            query, key, value, out, stream_calls,
            lambda q, k, v, m: streaming(q, k, v, pattern, scale, compiled),
        )  # fmt: skip
    elif stream == "flash":
        _each(
            query, key, value, out, stream_calls,
            lambda q, k, v, m: flashstream.streaming(q, k, v, pattern, scale, windowed),
        )  # fmt: skip


def default_stream(device: torch.device) -> str:
    """Return how the streaming heads run by default on `device`.

    On CUDA where Triton imports: the path the active crossover table measured faster on this GPU
    (`crossover.Crossover.stream`: "triton" or "flash"), else the Triton kernel. Elsewhere "flex".
    """
    if device.type != "cuda" or not triton_stream.available():
        return "flex"
    table = crossover.active(device)
    return table.stream if table is not None else "triton"


# `partitioned(streams=2)`: the full heads on a second CUDA stream while the streaming heads run on the current
# one, so each group's last, partly idle waves overlap the other's work. One side stream per device.
_SIDE: dict[int, torch.cuda.Stream] = {}


def two_streams(streams: int, device: torch.device) -> int:
    """Return how many CUDA streams `partitioned(streams=...)` uses on `device`: 2 asked on CUDA, else 1.

    Off a GPU there is one stream of work (a CPU runs ops in order), so `streams=2` is accepted and runs
    exactly the one-stream path (the same results, op for op).
    """
    if streams not in (1, 2):
        raise ValueError(f"streams must be 1 or 2, got {streams!r}")
    return 2 if streams == 2 and device.type == "cuda" else 1


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(device=index)
    return _SIDE[index]


@contextmanager
def _on_side(device: torch.device):
    """Run the block on the device's side stream, after the work queued so far on the current stream."""
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield


@kernel("partitioned")
def partitioned(
    call: Prefill,
    *,
    plans: Plans | None = None,
    compiled: bool | None = None,
    stream: str | None = None,
    full_call: str | None = None,
    streams: int = 1,
    windowed=None,
) -> torch.Tensor:
    """Return hybrid prefill attention (batch, n, heads, dim_v): sdpa for the full heads, window + sinks for the rest.

    `stream`: "triton", "flex" or "flash" (`STREAMS`; default `default_stream`); `full_call`: "one" (every
    full head in one sdpa call, `one_call`; the default with the Triton and flash streams) or "runs" (one call
    per head count / run of consecutive heads, read in place; the default with flex); `streams`: 2 runs the
    full heads on a second CUDA stream (`two_streams`; a CPU runs the one-stream path); `compiled`:
    FlexAttention through `torch.compile` (default: on CUDA); `windowed`: the flash path's windowed-attention
    primitive (`flashstream.Windowed`; default flash-attention on CUDA); `plans` as for `blocked`.
    """
    query, key, value, mask, full, pattern, scale = call
    compiled = query.device.type == "cuda" if compiled is None else compiled
    stream = stream or default_stream(query.device)
    if stream not in STREAMS:
        raise ValueError(f"unknown streaming path {stream!r}; expected one of {STREAMS}")
    side = two_streams(streams, query.device) == 2
    full_call = full_call or ("runs" if stream == "flex" else "one")
    batch, heads, n, _ = query.shape
    flags = tuple(bool(x) for x in full.tolist())
    if pattern.is_dense(n):  # the window covers every causal pair: all heads are full heads
        flags = (True,) * heads
    model = allowed_mask(mask)
    padding = Padding((0,) * batch, left=True) if model is None else (plans or Plans()).get(model, batch)
    if not padding.left:  # any mask but causal + left padding: the exact dense path
        return blocked(*call, plans=plans)
    out = query.new_empty(batch, n, heads, value.shape[-1])
    if not any(padding.starts):  # one call for the whole batch
        _rows(query, key, value, out, flags, pattern, scale, compiled, stream, full_call, side, windowed)
    else:
        for b, start in enumerate(padding.starts):  # row b runs from its first real token, as a prompt alone
            one = slice(b, b + 1), slice(None), slice(start, None)
            out[b, :start] = 0
            _rows(
                query[one], key[one], value[one], out[b : b + 1, start:], flags, pattern, scale, compiled,
                stream, full_call, side, windowed,
            )  # fmt: skip
    if stream == "triton" and not all(flags):  # every streaming head of every row: one launch
        heads, kv = stream_table(flags, key.shape[1], str(query.device))
        starts = torch.tensor(padding.starts, dtype=torch.int32, device=query.device)
        triton_stream.streaming_into(out, query, key, value, heads, kv, starts, pattern, scale)
    if side:  # the caller's stream sees `out` only once the full heads on the side stream are written
        torch.cuda.current_stream(query.device).wait_stream(_side_stream(query.device))
    return out


def takes_dense(
    n: int,
    full: torch.Tensor,
    pattern: Pattern,
    dense_below: float | None,
    device: torch.device | None = None,
) -> bool:
    """Return whether a layer's head set at prompt length n is better run dense.

    `dense_below` None or 0: never. Otherwise the measured crossover of this device where one is active
    (`crossover.active`: `CORELENS_CROSSOVER`), else the ideal rule: the head set's ideal speed-up below
    `dense_below` (`corelens.choices.DENSE_BELOW`).
    """
    if not dense_below or pattern.is_dense(n):
        return False
    share = float(full.float().mean())
    table = crossover.active(device or full.device)  # `device`: where the attention runs
    if table is not None:
        return table.dense(n, share)
    return ideal_speedup(n, share, pattern.sink, pattern.window) < dense_below
