"""The fast CPU path: thread-balanced causal sdpa for the full heads; block tiles through sdpa for the streaming heads.

For a streaming head, the first `S + W` positions of a row see every earlier key (the window still reaches
the sinks), so they are one plain causal sdpa call. Past them, queries are cut into blocks of `B` positions:
a block starting at `i0` needs only the `S` sink keys and the `W + B - 1` keys at `i0 - W + 1 .. i0 + B - 1`,
copied into one contiguous tile (about 1 % of the tile's arithmetic). A chunk of tiles is one fused sdpa
call (the CPU flash kernel: fp32 accumulation, no score matrix in memory) whose additive mask is the same
for every tile: all sinks, and window columns r .. r + W - 1 for block row r. The query heads that share a
KV head are stacked along the query axis, so each key tile serves all of them (GQA). Streaming heads thus
cost O(N (S + W)) instead of O(N^2), exact per query position.

Masks: None (causal) and causal-with-left-padding (rows start at their first real token; pad rows output
zeros, as sdpa) take the path above; any other model mask (right padding, custom masks) takes an exact but
dense path (chunks of queries over all earlier keys, the rule and the mask applied per position).
Arithmetic is fp32 whatever the input dtype; the output comes back in the input dtype. No large temporary is
allocated: on this hardware fresh multi-megabyte tensors cost more in page faults than their arithmetic.
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F

from corelens.attention.kernels.semantics import allowed_mask, is_dense, row_starts, streaming_keep

NEG_INF = float("-inf")
CHUNK_BYTES = 96 << 20  # key + value tiles per sdpa call: few calls (each a parallel region)


def block_size(groups: int) -> int:
    """Return the query block size B: g * B >= 768 stacked rows if B <= 128 allows (the flash kernel's large split)."""
    return int(min(128, max(32, math.ceil(768 / max(groups, 1)))))


BALANCED_MIN = 256  # prompt length from which plain causal heads may take `causal_balanced` on the CPU
Q_SPLIT = 256  # query rows per work unit of the CPU flash kernel (for prompts of 768 rows or more)


def _busiest(costs: list[float], threads: int) -> float:
    """Return the largest sum of one thread's share when `costs` are cut into `threads` contiguous chunks."""
    size = -(-len(costs) // threads)
    return max(sum(costs[i : i + size]) for i in range(0, len(costs), size))


def balance_pays(units: int, n: int, threads: int) -> bool:
    """Return whether `causal_balanced` beats one causal call for `units` = batch x heads on `threads`.

    The flash kernel hands each thread a contiguous run of (unit, query block) items; a causal block's work
    is the keys it sees. Predicts the busiest thread's work both ways; the split must win by 30 %: its copies,
    merge and second call cost 18-24 % (measured on 2 cores at 4k and 16k tokens: one head 0.84 -> 0.66 s,
    predicted 1.5x; three heads 2.12 -> 2.25 s in one run, 2.43 -> 2.01 s in another, predicted 1.17x,
    so three heads stay one call; benchmarks/hybrid_anatomy.py).
    """
    if threads < 2:
        return False
    blocks, h = -(-n // Q_SPLIT), (n + 1) // 2
    half = -(-h // Q_SPLIT)
    plain = [i + 0.5 for _ in range(units) for i in range(blocks)]
    diag = [i + 0.5 for _ in range(2 * units) for i in range(half)]
    rect = [float(half)] * (units * half)
    return 1.3 * (_busiest(diag, threads) + _busiest(rect, threads)) < _busiest(plain, threads)


def causal_balanced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Return causal sdpa of q over k, v (batch, heads, n, dim) with equal work per CPU thread.

    The CPU flash kernel hands each thread a contiguous run of (batch, head, query block) units; under a
    causal mask the late query blocks cost the most, so with an odd number of heads (one full head, three)
    one thread gets most of the work (measured at 16k tokens on 2 cores: one head alone 0.84-1.2 s, against
    0.66 s per head in a 16-head call, and 0.66-0.78 s through this function). Split at h = ceil(n / 2): the
    two causal diagonal halves run as one batch of two equal problems (the upper half padded by one zero row
    if n is odd: a key after every real query is masked, an extra query row is dropped) and the upper
    queries' rectangle over the lower keys runs as a plain (uniform) call; the two parts of the upper rows
    merge exactly through their log-sum-exps.
    """
    batch, heads, n, dim = q.shape
    h = (n + 1) // 2
    odd = 2 * h - n

    def upper(x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, h:]
        return F.pad(x, (0, 0, 0, odd)) if odd else x

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    qs, ks, vs = (torch.cat([x[:, :, :h], upper(x)]) for x in (q, k, v))
    diag, diag_lse = flash(qs, ks, vs, 0.0, True, scale=scale)
    low_k, low_v = k[:, :, :h].contiguous(), v[:, :, :h].contiguous()
    rect, rect_lse = flash(q[:, :, h:].contiguous(), low_k, low_v, 0.0, False, scale=scale)
    top, top_lse = diag[batch:, :, : n - h], diag_lse[batch:, :, : n - h]
    lse = torch.logaddexp(top_lse, rect_lse)
    merged = top * torch.exp(top_lse - lse)[..., None] + rect * torch.exp(rect_lse - lse)[..., None]
    return torch.cat([diag[:batch], merged], dim=2)


def full_heads(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    heads: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Return causal sdpa (batch, len(heads), n, dim_v) of the query heads `heads` (their KV heads gathered)."""
    groups = query.shape[1] // key.shape[1]
    kv = torch.div(heads, groups, rounding_mode="floor")
    q = query.index_select(1, heads)
    k, v = key.index_select(1, kv), value.index_select(1, kv)
    n = q.shape[2]
    cpu = q.device.type == "cpu" and q.dtype == torch.float32
    if (
        mask is None
        and cpu
        and n >= BALANCED_MIN
        and balance_pays(q.shape[0] * q.shape[1], n, torch.get_num_threads())
    ):
        return causal_balanced(q, k, v, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)


# The last mask checked (a weak reference, so a new tensor at a recycled address is never mistaken for it)
# and its answer: every layer of a forward passes the same mask object.
_LAST: list = [None, -1, None]


def left_padding(mask: torch.Tensor) -> torch.Tensor | None:
    """Return per-row starts if `mask` (batch, 1, n, n) is causal with left padding, else None (memoised)."""
    ref, version, starts = _LAST
    if ref is not None and ref() is mask and version == mask._version:
        return starts
    starts = _left_padding(mask)
    _LAST[:] = [weakref.ref(mask), mask._version, starts]
    return starts


def _left_padding(mask: torch.Tensor) -> torch.Tensor | None:
    # Row i must hold exactly the keys start..i (none before start): its count, first and last True say so.
    # Rows are checked in chunks through a uint8 view, so an N x N mask is never copied whole.
    batch, n = mask.shape[0], mask.shape[-1]
    starts = row_starts(mask, batch, mask.device)
    view = mask[:, 0].view(torch.uint8)
    rows = max(1, (16 << 20) // n)
    for r0 in range(0, n, rows):
        m = view[:, r0 : r0 + rows]
        i = torch.arange(r0, r0 + m.shape[1], device=mask.device)[None, :]
        count = m.sum(dim=-1, dtype=torch.int64)
        first = m.max(dim=-1).indices
        last = n - 1 - m.flip(-1).max(dim=-1).indices
        real = i >= starts[:, None]
        ok = torch.where(
            real, (count == i - starts[:, None] + 1) & (first == starts[:, None]) & (last == i), count == 0
        )
        if not bool(ok.all()):
            return None
    return starts


class Scratch:
    """Flat fp32 scratch memory handed out as views, reused by every chunk and KV head of one call."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flat: dict[str, torch.Tensor] = {}

    def get(self, name: str, *shape: int) -> torch.Tensor:
        """Return an uninitialised view of `shape`, growing the named buffer when needed."""
        size = math.prod(shape)
        flat = self._flat.get(name)
        if flat is None or flat.numel() < size:
            flat = self._flat[name] = torch.empty(size, device=self.device)
        return flat[:size].view(shape)


def tile_rule(block: int, sink: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """Return the (B, S + W + B - 1) booleans of a tile past the prefix: every sink; window columns r..r+W-1."""
    r = torch.arange(block, device=device)[:, None]
    c = torch.arange(window + block - 1, device=device)[None, :]
    window_ok = (c >= r) & (c <= r + window - 1)
    return torch.cat([torch.ones(block, sink, dtype=torch.bool, device=device), window_ok], dim=1)


def _additive(ok: torch.Tensor, groups: int) -> torch.Tensor:
    """Return the (m, 1, groups * B, keys) additive mask of (m, B, keys) booleans, rows repeated per head."""
    m, block, keys = ok.shape
    bias = torch.zeros(m, 1, groups, block, keys, device=ok.device)
    bias.masked_fill_(~ok[:, None, None], NEG_INF)
    return bias.view(m, 1, groups * block, keys)


def streaming_group(
    query: torch.Tensor,
    heads: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    start: int,
    sink: int,
    window: int,
    scale: float,
    block: int,
    scratch: Scratch | None = None,
) -> None:
    """Write streaming attention of query heads `heads` of `query` (heads, n, dim) into `out` (n, heads, dim_v).

    The heads share one KV head, `k` (n, dim) and `v` (n, dim_v), fp32. The model's mask is causal, with the
    padding (if any) before `start`, the row's first real token; those rows get zeros.
    """
    g = len(heads)
    n, dim = k.shape
    dim_v = v.shape[-1]
    device = k.device
    contiguous = g == 1 or bool((heads[1:] - heads[:-1] == 1).all())
    h0 = int(heads[0])

    def write(r0: int, rows: torch.Tensor) -> None:
        if contiguous:
            out[r0 : r0 + len(rows), h0 : h0 + g] = rows
        else:
            out[r0 : r0 + len(rows)].index_copy_(1, heads, rows.to(out.dtype))

    # 1. Prefix: queries start .. start + S + W - 1 keep every earlier key, a plain causal attention.
    end = min(n, start + sink + window)
    q = query[h0 : h0 + g, start:end] if contiguous else query[heads, start:end]
    kk = k[start:end].expand(g, end - start, dim)
    vv = v[start:end].expand(g, end - start, dim_v)
    o = F.scaled_dot_product_attention(q.float(), kk, vv, is_causal=True, scale=scale)
    write(start, o.transpose(0, 1))
    if start:
        write(0, torch.zeros(start, g, dim_v, device=device))
    tiles = math.ceil((n - end) / block)
    if tiles <= 0:
        return

    # 2. Tiles: the window of tile t is keys base + t*B .. base + t*B + span - 1, a fixed-stride view of a
    # copy of k[base:] with zeros past n; no window reaches back to the sinks.
    span = window + block - 1
    rows = g * block
    base = end - window + 1
    scratch = scratch or Scratch(device)
    kp = scratch.get("kp", window - 1 + tiles * block, dim)
    vp = scratch.get("vp", window - 1 + tiles * block, dim_v)
    for padded, src in ((kp, k), (vp, v)):
        padded[: n - base] = src[base:]
        padded[n - base :].zero_()
    win_k = kp.as_strided((tiles, span, dim), (block * dim, dim, 1))
    win_v = vp.as_strided((tiles, span, dim_v), (block * dim_v, dim_v, 1))
    keys = sink + span
    chunk = max(1, min(tiles, CHUNK_BYTES // (keys * (dim + dim_v) * 4)))
    kt = scratch.get("k", chunk, 1, keys, dim)
    vt = scratch.get("v", chunk, 1, keys, dim_v)
    kt[:, 0, :sink] = k[start : start + sink]
    vt[:, 0, :sink] = v[start : start + sink]
    bias = _additive(tile_rule(block, sink, window, device)[None], g)
    qt = scratch.get("q", chunk, g, block, dim)

    for t0 in range(0, tiles, chunk):
        t1 = min(tiles, t0 + chunk)
        m = t1 - t0
        r0 = end + t0 * block
        r1 = min(n, end + t1 * block)
        q = query[h0 : h0 + g, r0:r1] if contiguous else query[heads, r0:r1]
        whole = (r1 - r0) // block
        qt[:whole] = q[:, : whole * block].view(g, whole, block, dim).transpose(0, 1)
        if whole < m:  # the last tile runs past n: zero queries, discarded
            qt[whole].zero_()
            qt[whole, :, : r1 - r0 - whole * block] = q[:, whole * block :]
        qv = qt[:m].view(m, 1, rows, dim)
        kt[:m, 0, sink:] = win_k[t0:t1]
        vt[:m, 0, sink:] = win_v[t0:t1]
        ob = F.scaled_dot_product_attention(qv, kt[:m], vt[:m], attn_mask=bias, scale=scale)
        write(r0, ob.view(m, g, block, dim_v).transpose(1, 2).reshape(m * block, g, dim_v)[: r1 - r0])


def general_group(
    query: torch.Tensor,
    heads: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    model: torch.Tensor,
    start: int,
    sink: int,
    window: int,
    scale: float,
) -> None:
    """Like `streaming_group` under an arbitrary (n, n) model mask: exact, dense cost, chunked memory."""
    n = k.shape[0]
    g = len(heads)
    chunk = max(1, (1 << 24) // n)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        q_pos = torch.arange(r0, r1, device=k.device)[None]
        k_pos = torch.arange(r1, device=k.device)[None]
        starts = torch.tensor([start], device=k.device)
        ok = streaming_keep(q_pos, k_pos, starts, sink, window)[0] & model[r0:r1, :r1]
        q = query[heads, r0:r1].float()
        kk, vv = k[:r1].expand(g, r1, k.shape[1]), v[:r1].expand(g, r1, v.shape[1])
        o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=ok, scale=scale)
        out[r0:r1].index_copy_(1, heads, o.transpose(0, 1).to(out.dtype))


def blocked(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    full: torch.Tensor,
    sink: int,
    window: int,
    scale: float,
    *,
    block: int | None = None,
) -> torch.Tensor:
    """Return hybrid prefill attention (batch, n, heads, dim_v) for n queries over the same n keys."""
    batch, heads, n, _ = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    device = query.device
    mask = allowed_mask(mask)
    full = full.to(device=device, dtype=torch.bool)
    if is_dense(n, sink, window):  # the window covers every causal pair: all heads are full heads
        full = torch.ones_like(full)
    out = torch.empty(batch, n, heads, value.shape[-1], dtype=query.dtype, device=device)
    full_idx = full.nonzero().flatten()
    if len(full_idx):
        out.index_copy_(2, full_idx, full_heads(query, key, value, mask, full_idx, scale).transpose(1, 2))
    if len(full_idx) == heads:
        return out

    starts = None if mask is None else left_padding(mask.expand(batch, -1, -1, -1))
    general = mask is not None and starts is None  # any other mask: the exact but dense path
    if general:
        starts = row_starts(mask, batch, device)
    starts = [0] * batch if starts is None else starts.tolist()
    stream = (~full).view(kv_heads, groups)
    scratch = Scratch(device)
    for b in range(batch):
        model = mask[b if mask.shape[0] > 1 else 0, 0] if general else None
        for j in range(kv_heads):
            idx = stream[j].nonzero().flatten() + j * groups
            if len(idx):
                k, v = key[b, j].float(), value[b, j].float()
                if general:
                    general_group(query[b], idx, k, v, out[b], model, starts[b], sink, window, scale)
                    continue
                bs = block or block_size(len(idx))
                streaming_group(query[b], idx, k, v, out[b], starts[b], sink, window, scale, bs, scratch)
    return out
