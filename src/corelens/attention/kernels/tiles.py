"""The fast CPU path: thread-balanced causal sdpa for the full heads; a banded pass for the streaming heads.

For a streaming head, the first `S + W` positions of a row see every earlier key (the window still reaches
the sinks), so they are one plain causal sdpa call. Past them, a query at position i needs only the `S` sink
keys and the `W` keys i - W + 1 .. i, and the query heads that share a KV head are stacked so that each key
serves all of them (GQA). Three ways to run them (`PATHS`), all exact per query position:

- band (the CPU default, `band.py` / `band.cpp`, where the C++ extension builds and the prompt is long
  enough to pay for building it once): tiles of R positions; BLAS GEMMs read the sink and window keys in
  place; each row's softmax runs over exactly its own keys (R - 1 columns per row computed and dropped); no
  merge, no copy of the keys.
- split (the CPU fallback, `_SplitTiles`; blocks of B queries): the W - B + 1 keys that every query of the
  block sees are read through a fixed-stride view of the keys, without a mask; the sinks and the B - 1 keys
  on either side of them form a small masked tile; the two flash calls merge by their log-sum-exps.
- masked (other devices, or B > W; `_MaskedTiles`): the sinks and the whole window copied into one tile under
  an additive mask that is the same for every tile (all sinks; window columns r .. r + W - 1 for block row r).

Streaming heads thus cost O(N (S + W)) instead of O(N^2).

Masks: None (causal) and causal-with-left-padding (rows start at their first real token; pad rows output
zeros, as sdpa) take the paths above; any other model mask (right padding, custom masks) takes an exact but
dense path (chunks of queries over all earlier keys, the rule and the mask applied per position).
Arithmetic is fp32 whatever the input dtype; the output comes back in the input dtype. No large temporary is
allocated: on this hardware fresh multi-megabyte tensors cost more in page faults than their arithmetic
(every sdpa call's output stays under `OUT_BYTES`; full heads and split tiles merge in place).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F

from corelens.attention.kernels import band
from corelens.attention.kernels.semantics import allowed_mask, is_dense, row_starts, streaming_keep
from corelens.errors import OptionError

NEG_INF = float("-inf")
CHUNK_BYTES = 96 << 20  # key + value tiles per sdpa call: few calls (each a parallel region)
# Outputs of one sdpa call at most: glibc serves blocks above 32 MB with fresh mmap'ed pages, and their page
# faults cost more than the call's arithmetic saves; smaller blocks are reused from the heap.
OUT_BYTES = 16 << 20


def block_size(groups: int) -> int:
    """Return the query block size B: g * B >= 768 stacked rows if B <= 128 allows (the flash kernel's large split)."""
    return int(min(128, max(32, math.ceil(768 / max(groups, 1)))))


BALANCED_MIN = 256  # prompt length from which plain causal heads may take `balanced_parts` on the CPU
Q_SPLIT = 256  # query rows per work unit of the CPU flash kernel (for prompts of 768 rows or more)
# Block of the split tile path: B = 48 .. 128 time within 4 % of each other for 8 stacked heads at 16k tokens,
# S = 128, W = 1024 (benchmarks/hybrid_anatomy.py); 96 keeps g * B >= 768 rows for 8 heads.
SPLIT_BLOCK = 96


def _busiest(costs: list[float], threads: int) -> float:
    """Return the largest sum of one thread's share when `costs` are cut into `threads` contiguous chunks."""
    size = -(-len(costs) // threads)
    return max(sum(costs[i : i + size]) for i in range(0, len(costs), size))


def balance_pays(units: int, n: int, threads: int) -> bool:
    """Return whether `balanced_parts` beats one causal call for `units` = batch x heads on `threads`.

    The flash kernel hands each thread a contiguous run of (unit, query block) items; a causal block's work
    is the keys it sees. Predicts the busiest thread's work both ways; the split must win by its own cost,
    O(n) copies and a merge against the O(n^2) call: a margin of 5 % at 16k tokens, scaled by 16k / n.
    Measured on 2 cores, split against one call (benchmarks/hybrid_anatomy.py, two runs): one head 1.33-1.43x
    at 16k and 1.23-1.37x at 4k (predicted 1.5x), two heads 0.97-0.98x (predicted 1.0x: one call), three and
    five heads 1.00-1.16x (predicted 1.17x / 1.1x).
    """
    if threads < 2:
        return False
    blocks, h = -(-n // Q_SPLIT), (n + 1) // 2
    half = -(-h // Q_SPLIT)
    plain = [i + 0.5 for _ in range(units) for i in range(blocks)]
    diag = [i + 0.5 for _ in range(2 * units) for i in range(half)]
    rect = [float(half)] * (units * half)
    margin = 1 + 0.05 * 16384 / n
    return margin * (_busiest(diag, threads) + _busiest(rect, threads)) < _busiest(plain, threads)


def _halves(x: torch.Tensor, h: int) -> torch.Tensor:
    """Return (2 batch, heads, h, dim): rows :h of `x`, then rows h: (one zero row appended if n is odd)."""
    batch, heads, n, dim = x.shape
    if batch == 1 and n == 2 * h:  # a view: the second half is the first shifted by h rows
        return x.as_strided((2, heads, h, dim), (h * x.stride(2), x.stride(1), x.stride(2), x.stride(3)))
    return torch.cat([x[:, :, :h], F.pad(x[:, :, h:], (0, 0, 0, 2 * h - n))])


def balanced_parts(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return causal sdpa of q over k, v (batch, heads, n, dim) as its rows :ceil(n/2) and the rest, balanced.

    The CPU flash kernel hands each thread a contiguous run of (batch, head, query block) units; under a
    causal mask the late query blocks cost the most, so with an odd number of heads one thread gets most of
    the work (`balance_pays`). Split at h = ceil(n / 2): the two causal diagonal halves run as one batch of
    two equal problems (the upper half padded by one zero row if n is odd: a key after every real query is
    masked, an extra query row is dropped) and the upper queries' rectangle over the lower keys runs as a
    plain (uniform) call; the two parts of the upper rows merge exactly through their log-sum-exps (the
    weight of the rectangle is sigmoid(lse_rect - lse_diag), merged in place). For one prompt of even
    length the halves are views of the inputs, not copies.
    """
    batch, n = q.shape[0], q.shape[2]
    h = (n + 1) // 2
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    diag, diag_lse = flash(_halves(q, h), _halves(k, h), _halves(v, h), 0.0, True, scale=scale)
    rect, rect_lse = flash(q[:, :, h:], k[:, :, :h], v[:, :, :h], 0.0, False, scale=scale)
    top, top_lse = diag[batch:, :, : n - h], diag_lse[batch:, :, : n - h]
    return diag[:batch], top.lerp_(rect, torch.sigmoid(rect_lse - top_lse)[..., None])


def causal_balanced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Return causal sdpa of q over k, v (batch, heads, n, dim) with equal work per CPU thread (`balanced_parts`)."""
    return torch.cat(balanced_parts(q, k, v, scale), dim=2)


def full_heads(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    heads: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Write causal sdpa of the query heads `heads` into their heads of `out` (batch, n, all heads, dim_v).

    On the CPU (fp32, plain causal) where one head alone would leave a thread idle (`balance_pays`), each
    head runs on its own through `balanced_parts`: balanced whatever the number of full heads, its query,
    key and value read in place, and its sdpa outputs small enough to reuse heap memory rather than fault
    in fresh pages. Otherwise one sdpa call over the gathered heads.
    """
    groups = query.shape[1] // key.shape[1]
    n = query.shape[2]
    cpu = query.device.type == "cpu" and query.dtype == torch.float32
    if (
        mask is None
        and cpu
        and n >= BALANCED_MIN
        and balance_pays(query.shape[0], n, torch.get_num_threads())
    ):
        for head in heads.tolist():
            j = head // groups
            lower, upper = balanced_parts(
                query[:, head : head + 1], key[:, j : j + 1], value[:, j : j + 1], scale
            )
            h = lower.shape[2]
            out[:, :h, head] = lower[:, 0]
            out[:, h:, head] = upper[:, 0]
        return
    kv = torch.div(heads, groups, rounding_mode="floor")
    q, k, v = query.index_select(1, heads), key.index_select(1, kv), value.index_select(1, kv)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale)
    out.index_copy_(2, heads, o.transpose(1, 2))


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


def split_block(window: int, block: int | None = None) -> int | None:
    """Return the block size of the split tile path for `window`, or None where it does not apply (B < 2 or B > W)."""
    b = block or min(SPLIT_BLOCK, window)
    return b if 2 <= b <= window else None


def edge_rule(block: int, sink: int, device: torch.device | None = None) -> torch.Tensor:
    """Return the (B, S + 2 (B - 1)) booleans of a split tile's edge keys: every sink; left c >= r; right c < r."""
    r = torch.arange(block, device=device)[:, None]
    c = torch.arange(block - 1, device=device)[None, :]
    return torch.cat([torch.ones(block, sink, dtype=torch.bool, device=device), c >= r, c < r], dim=1)


class _Tiles:
    """The tiles of one streaming group past its prefix: tile t holds queries end + t B .. end + t B + B - 1."""

    def __init__(self, k, v, end, sink, window, block, groups, start, scratch):
        self.k, self.v, self.end, self.sink, self.window, self.block = k, v, end, sink, window, block
        self.count = math.ceil((k.shape[0] - end) / block)
        self.rows = groups * block
        self.start, self.groups, self.scratch = start, groups, scratch

    def chunk(self, keys: int) -> int:
        """Return how many tiles one sdpa call takes when each tile holds `keys` key and value rows."""
        per_tile = keys * (self.k.shape[1] + self.v.shape[1]) * 4
        out_tile = self.rows * max(self.k.shape[1], self.v.shape[1]) * 4
        return max(1, min(self.count, CHUNK_BYTES // per_tile, OUT_BYTES // out_tile))

    def padded(self, name: str, src: torch.Tensor, first: int, length: int) -> torch.Tensor:
        """Return scratch rows src[first:first + length], zeros past the end of `src`."""
        out = self.scratch.get(name, length, src.shape[1])
        real = max(0, min(length, src.shape[0] - first))
        out[:real] = src[first : first + real]
        out[real:].zero_()
        return out

    def keyed(self, name: str, src: torch.Tensor, keys: int) -> torch.Tensor:
        """Return a scratch (tiles per call, 1, keys, dim) tile of `src` rows whose first S rows hold the sinks."""
        out = self.scratch.get(name, self.per_call, 1, keys, src.shape[1])
        out[:, 0, : self.sink] = src[self.start : self.start + self.sink]
        return out


class _MaskedTiles(_Tiles):
    """Each tile as one sdpa call over its sinks and W + B - 1 window keys, the band applied by an additive mask."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        b, s, w = self.block, self.sink, self.window
        span = w + b - 1
        base = self.end - w + 1  # the window of tile t: keys base + t B .. base + t B + span - 1
        length = w - 1 + self.count * b
        dim, dim_v = self.k.shape[1], self.v.shape[1]
        kp, vp = self.padded("kp", self.k, base, length), self.padded("vp", self.v, base, length)
        self.win_k = kp.as_strided((self.count, span, dim), (b * dim, dim, 1))
        self.win_v = vp.as_strided((self.count, span, dim_v), (b * dim_v, dim_v, 1))
        self.per_call = self.chunk(s + span)
        self.kt, self.vt = self.keyed("k", self.k, s + span), self.keyed("v", self.v, s + span)
        self.bias = _additive(tile_rule(b, s, w, self.k.device)[None], self.groups)

    def attend(self, qv: torch.Tensor, t0: int, t1: int, scale: float) -> torch.Tensor:
        """Return the (m, 1, g B, dim_v) outputs of tiles t0 .. t1 - 1 for their stacked queries `qv`."""
        m, s = t1 - t0, self.sink
        self.kt[:m, 0, s:] = self.win_k[t0:t1]
        self.vt[:m, 0, s:] = self.win_v[t0:t1]
        return F.scaled_dot_product_attention(qv, self.kt[:m], self.vt[:m], attn_mask=self.bias, scale=scale)


class _SplitTiles(_Tiles):
    """Each tile as two CPU flash calls merged by their log-sum-exps (no mask on most of the keys).

    Middle: the W - B + 1 keys i0 + B - W .. i0 that every query of the block sees, read through a
    fixed-stride view of one padded copy of the keys (no copy per tile, no mask). Edges: the S sinks, the
    B - 1 keys before the middle (query r sees left column c iff c >= r) and the B - 1 after it (right
    column c iff c < r), copied into one small tile under an additive mask. Every query sees at least one
    middle key and B - 1 edge keys, so both log-sum-exps are finite and the merge weight of the middle is
    sigmoid(lse_mid - lse_edge).
    """

    def __init__(self, *args) -> None:
        super().__init__(*args)
        b, s, w, end = self.block, self.sink, self.window, self.end
        # One copy of the keys (values), B zero rows past n for the last tile's right keys. Tile t reads its
        # middle at end + B - W + t B, its left keys at end - W + 1 + t B and its right keys at end + 1 + t B.
        self.mids, self.edges = [], []
        for name, x in (("kp", self.k), ("vp", self.v)):
            dim = x.shape[1]
            xp = self.padded(name, x, 0, x.shape[0] + b)
            self.mids.append(
                xp[end + b - w :].as_strided((self.count, 1, w - b + 1, dim), (b * dim, 0, dim, 1))
            )
            left, right = (
                xp[i:].as_strided((self.count, b - 1, dim), (b * dim, dim, 1)) for i in (end - w + 1, end + 1)
            )
            self.edges.append((left, right))
        self.per_call = self.chunk(s + 2 * (b - 1))
        self.et = [self.keyed(name, x, s + 2 * (b - 1)) for name, x in (("ke", self.k), ("ve", self.v))]
        self.bias = _additive(edge_rule(b, s, self.k.device)[None], self.groups)

    def attend(
        self,
        qv: torch.Tensor,
        t0: int,
        t1: int,
        scale: float,
        into: list[tuple[int, torch.Tensor]] | None = None,
    ) -> torch.Tensor | None:
        """Return the (m, 1, g B, dim_v) outputs of tiles t0 .. t1 - 1 for their stacked queries `qv`.

        With `into`, pairs of (first stacked head i, an fp32 (m, heads, B, dim_v) view of the output for the
        stacked heads i ..), the merge writes there (no copy) and returns None.
        """
        m, s, b = t1 - t0, self.sink, self.block
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


def head_runs(heads: torch.Tensor) -> list[tuple[int, int, int]]:
    """Return the runs of consecutive heads in sorted `heads` as (first stacked index, end, first head)."""
    h = heads.tolist()
    cuts = [0] + [i for i in range(1, len(h)) if h[i] != h[i - 1] + 1] + [len(h)]
    return [(i, j, h[i]) for i, j in zip(cuts[:-1], cuts[1:])]


PATHS = ("band", "split", "masked")
# Query positions past the prefix from which the default path builds the band kernel (once per machine, about
# 45 s on 2 cores, then cached): shorter prompts take the split tiles, whose cost there is a fraction of a second.
BAND_MIN = 2048


def streaming_path(device: torch.device, window: int, block: int | None = None, rows: int = BAND_MIN) -> str:
    """Return the streaming heads' default path on `device` for `rows` query positions past the prefix."""
    if device.type != "cpu":
        return "masked"
    if rows >= BAND_MIN and band.module() is not None:
        return "band"
    return "split" if split_block(window, block) is not None else "masked"


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
    block: int | None = None,
    scratch: Scratch | None = None,
    *,
    path: str | None = None,
) -> None:
    """Write streaming attention of query heads `heads` of `query` (heads, n, dim) into `out` (n, heads, dim_v).

    The heads share one KV head, `k` (n, dim) and `v` (n, dim_v), fp32. The model's mask is causal, with the
    padding (if any) before `start`, the row's first real token; those rows get zeros. Past the prefix, one of
    `PATHS` runs (default `streaming_path`): the C++ band kernel (CPU, where it builds), the split tiles (CPU,
    where `split_block` applies) or the masked tiles (any device); `block` overrides the tile height of each.
    """
    if path not in (None, *PATHS):
        raise OptionError(f"unknown streaming path {path!r}; expected one of {PATHS}")
    g = len(heads)
    n, dim = k.shape
    dim_v = v.shape[-1]
    device = k.device
    runs = head_runs(heads)  # runs of consecutive heads are read and written through views

    def write(r0: int, rows: torch.Tensor) -> None:
        for i, j, h in runs:
            out[r0 : r0 + len(rows), h : h + j - i] = rows[:, i:j]

    # 1. Prefix: queries start .. start + S + W - 1 keep every earlier key, a plain causal attention.
    end = min(n, start + sink + window)
    h0 = runs[0][2]
    q = query[h0 : h0 + g, start:end] if len(runs) == 1 else query[heads, start:end]
    kk = k[start:end].expand(g, end - start, dim)
    vv = v[start:end].expand(g, end - start, dim_v)
    o = F.scaled_dot_product_attention(q.float(), kk, vv, is_causal=True, scale=scale)
    write(start, o.transpose(0, 1))
    if start:
        write(0, torch.zeros(start, g, dim_v, device=device))
    if end >= n:
        return

    # 2. Past the prefix no window reaches back to the sinks.
    path = path or streaming_path(device, window, block, n - end)
    if path == "band":
        _band(query, heads, k, v, out, start, end, sink, window, scale, block, write)
        return
    scratch = scratch or Scratch(device)
    fast = split_block(window, block) if path == "split" and device.type == "cpu" else None
    if fast is not None:
        tiles: _Tiles = _SplitTiles(k, v, end, sink, window, fast, g, start, scratch)
    else:
        b = block or block_size(g)
        tiles = _MaskedTiles(k, v, end, sink, window, b, g, start, scratch)
    b = tiles.block
    direct = fast is not None and out.dtype == torch.float32
    qt = scratch.get("q", tiles.per_call, g, b, dim)
    for t0 in range(0, tiles.count, tiles.per_call):
        t1 = min(tiles.count, t0 + tiles.per_call)
        m = t1 - t0
        r0 = end + t0 * b
        r1 = min(n, end + t1 * b)
        whole = (r1 - r0) // b
        if whole < m:  # the last tile runs past n: zero queries, discarded
            qt[whole].zero_()
        for i, j, h in runs:
            q = query[h : h + j - i, r0:r1]
            qt[:whole, i:j] = q[:, : whole * b].view(j - i, whole, b, dim).transpose(0, 1)
            if whole < m:
                qt[whole, i:j, : r1 - r0 - whole * b] = q[:, whole * b :]
        qv = qt[:m].view(m, 1, g * b, dim)
        if direct and whole == m:  # the merge writes straight into `out`
            into = [
                (i, out[r0 : r0 + m * b, h : h + j - i].view(m, b, j - i, dim_v).permute(0, 2, 1, 3))
                for i, j, h in runs
            ]
            tiles.attend(qv, t0, t1, scale, into=into)
            continue
        ob = tiles.attend(qv, t0, t1, scale)
        write(r0, ob.view(m, g, b, dim_v).transpose(1, 2).reshape(m * b, g, dim_v)[: r1 - r0])


def _band(query, heads, k, v, out, start, end, sink, window, scale, rows, write) -> None:
    """Run the C++ band kernel for rows end .. n - 1 (fp32 copies of the query and output where they are not)."""
    if band.module() is None:
        raise RuntimeError(f"the C++ band kernel is unavailable: {band.error()}")
    g = len(heads)
    q, q_heads = query, heads
    if query.dtype != torch.float32 or query.stride(-1) != 1:
        q, q_heads = query[heads].float().contiguous(), torch.arange(g)
    if out.dtype == torch.float32 and out.stride(-1) == 1:
        band.band(q, q_heads, k, v, out, heads, start, end, sink, window, scale, rows)
        return
    rows_out = torch.empty(k.shape[0], g, v.shape[-1], device=k.device)
    band.band(q, q_heads, k, v, rows_out, torch.arange(g), start, end, sink, window, scale, rows)
    write(end, rows_out[end:])


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
    path: str | None = None,
) -> torch.Tensor:
    """Return hybrid prefill attention (batch, n, heads, dim_v) for n queries over the same n keys.

    `block` and `path` reach `streaming_group` (the tests use them to take every path).
    """
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
        full_heads(query, key, value, mask, full_idx, scale, out)
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
                streaming_group(
                    query[b], idx, k, v, out[b], starts[b], sink, window, scale, block, scratch, path=path
                )
    return out
