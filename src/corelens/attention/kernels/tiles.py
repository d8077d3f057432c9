"""The blocked CPU path: thread-balanced causal sdpa for the full heads; tiled passes for the streaming heads.

For a streaming head, the queries before `Pattern.prefix_end` see every earlier key (the window still reaches
the sinks), so they are one plain causal sdpa call. Past them a query needs only its `S` sink keys and its
`W` window keys (docs/methods.md#hybrid), the same shape for every query, and the query heads that share a
KV head are stacked so that each key serves all of them (GQA). Three paths (`PATHS`), each a module with one
function `attend(group, block, scratch)` (`tiling.Group`: one streaming group of one batch row), all exact
per query position:

- band (the CPU default, `band.py` / `band.cpp`, where the C++ extension builds and the prompt is long
  enough to pay for building it once): tiles of R positions; BLAS GEMMs read the sink and window keys in
  place; each row's softmax runs over exactly its own keys; no merge, no copy of the keys.
- split (the CPU fallback, `split.py`; tiles of B queries): the window keys every query of the tile sees,
  read in place without a mask, and a small masked tile of the sinks and the keys on either side; the two
  flash calls merge by their log-sum-exps.
- masked (other devices, or B > W; `masked.py`): the sinks and the whole window copied into one tile under
  an additive mask that is the same for every tile.

Streaming heads thus cost O(N (S + W)) instead of O(N^2). Every tile mask is the rule of `masks.py`
evaluated on the tile's layout (`masks.tile_mask`).

Masks: None (causal) and causal-with-left-padding (rows start at their first real token; pad rows output
zeros, as sdpa) take the paths above; any other model mask (right padding, custom masks) takes an exact but
dense path (chunks of queries over all earlier keys, the rule and the mask applied per position). Which one
is a `Padding`, computed once per mask (`Plans`, owned by the caller that sees the mask of every layer).
Arithmetic is fp32 whatever the input dtype; the output comes back in the input dtype.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from corelens.attention.kernels import band, masked, split
from corelens.attention.kernels.causal import full_heads
from corelens.attention.kernels.interface import Prefill, kernel
from corelens.attention.kernels.masks import allowed_mask, row_starts, streaming_keep
from corelens.attention.kernels.tiling import Group, Scratch
from corelens.errors import OptionError

PATHS = ("band", "split", "masked")
_ATTEND = {"band": band.attend, "split": split.attend, "masked": masked.attend}
# Query positions past the prefix from which the default path builds the band kernel (once per machine, then
# cached); shorter prompts take the split tiles (benchmarks/README.md#hybrid-kernel-constants).
BAND_MIN = 2048


@dataclass(frozen=True)
class Padding:
    """How a model mask pads its batch: each row's first real position, and whether the tiled paths apply.

    `left`: the mask is causal with left padding (row i of a batch row holds exactly the keys start .. i);
    otherwise the streaming heads take the exact dense path.
    """

    starts: tuple[int, ...]
    left: bool

    @classmethod
    def of(cls, mask: torch.Tensor, batch: int) -> Padding:
        """Return the padding of a boolean model mask (batch | 1, 1, n, n)."""
        mask = mask.expand(batch, -1, -1, -1)
        starts = row_starts(mask, batch, mask.device)
        return cls(tuple(starts.tolist()), _left_padded(mask, starts))


def _left_padded(mask: torch.Tensor, starts: torch.Tensor) -> bool:
    # Row i must hold exactly the keys start..i (none before start): its count, first and last True say so.
    # Rows are checked in chunks through a uint8 view, so an N x N mask is never copied whole.
    n = mask.shape[-1]
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
            return False
    return True


class Plans:
    """The `Padding` of the last model mask seen: every decoder layer of a forward passes the same mask object.

    Owned by the caller that runs the layers (a hybrid session), so the scan runs once per forward, not per
    layer. The mask is held weakly (a finished forward's mask is freed, and a new tensor at a recycled
    address is never mistaken for it); a forward never edits its mask in place.
    """

    def __init__(self) -> None:
        self._mask: weakref.ref | None = None
        self._padding: Padding | None = None

    def get(self, mask: torch.Tensor, batch: int) -> Padding:
        """Return the padding of boolean `mask` for `batch` rows, computed once per mask object."""
        if self._mask is None or self._mask() is not mask or self._padding is None:
            self._padding = Padding.of(mask, batch)
            self._mask = weakref.ref(mask)
        return self._padding


def streaming_path(device: torch.device, window: int, block: int | None = None, rows: int = BAND_MIN) -> str:
    """Return the streaming heads' default path on `device` for `rows` query positions past the prefix."""
    if device.type != "cpu":
        return "masked"
    if rows >= BAND_MIN and band.module() is not None:
        return "band"
    return "split" if split.split_block(window, block) is not None else "masked"


def streaming_group(
    group: Group, block: int | None = None, scratch: Scratch | None = None, *, path: str | None = None
) -> None:
    """Write streaming attention of `group` into its output rows (causal model mask, padding before `start`).

    Padding rows get zeros; the prefix is one causal sdpa call; past it one of `PATHS` runs (default
    `streaming_path`): the C++ band kernel (CPU, where it builds), the split tiles (CPU, where
    `split.split_block` applies, else the masked tiles) or the masked tiles (any device). `block` overrides
    the tile height of each.
    """
    if path not in (None, *PATHS):
        raise OptionError(f"unknown streaming path {path!r}; expected one of {PATHS}")
    query, heads, k, v, start, end = group.query, group.heads, group.key, group.value, group.start, group.end
    g, (n, dim), dim_v = len(heads), k.shape, v.shape[-1]
    device = k.device

    # 1. Prefix: queries start .. end - 1 keep every earlier key, a plain causal attention.
    h0 = group.runs[0][2]
    q = query[h0 : h0 + g, start:end] if len(group.runs) == 1 else query[heads, start:end]
    kk = k[start:end].expand(g, end - start, dim)
    vv = v[start:end].expand(g, end - start, dim_v)
    o = F.scaled_dot_product_attention(q.float(), kk, vv, is_causal=True, scale=group.scale)
    group.write(start, o.transpose(0, 1))
    if start:
        group.write(0, torch.zeros(start, g, dim_v, device=device))
    if end >= n:
        return

    # 2. Past the prefix no window reaches back to the sinks.
    path = path or streaming_path(device, group.pattern.window, block, n - end)
    if path == "split" and (device.type != "cpu" or split.split_block(group.pattern.window, block) is None):
        path = "masked"  # the split tiles need the CPU flash kernel and 2 <= B <= W
    _ATTEND[path](group, block, scratch or Scratch(device))


def general_group(group: Group, model: torch.Tensor) -> None:
    """Like `streaming_group` under an arbitrary (n, n) model mask: exact, dense cost, chunked memory."""
    k, v, heads, n = group.key, group.value, group.heads, group.n
    g = len(heads)
    chunk = max(1, (1 << 24) // n)
    starts = torch.tensor([group.start], device=k.device)
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        q_pos = torch.arange(r0, r1, device=k.device)[None]
        k_pos = torch.arange(r1, device=k.device)[None]
        ok = streaming_keep(q_pos, k_pos, starts, group.pattern)[0] & model[r0:r1, :r1]
        q = group.query[heads, r0:r1].float()
        kk, vv = k[:r1].expand(g, r1, k.shape[1]), v[:r1].expand(g, r1, v.shape[1])
        o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=ok, scale=group.scale)
        group.out[r0:r1].index_copy_(1, heads, o.transpose(0, 1).to(group.out.dtype))


@kernel("blocked")
def blocked(
    call: Prefill, *, block: int | None = None, path: str | None = None, plans: Plans | None = None
) -> torch.Tensor:
    """Return hybrid prefill attention (batch, n, heads, dim_v) for n queries over the same n keys.

    `block` and `path` reach `streaming_group` (the tests use them to take every path); `plans` remembers the
    mask's `Padding` across calls (the layers of one forward).
    """
    query, key, value, mask, full, pattern, scale = call
    batch, heads, n, _ = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    device = query.device
    mask = allowed_mask(mask)
    full = full.to(device=device, dtype=torch.bool)
    if pattern.is_dense(n):  # the window covers every causal pair: all heads are full heads
        full = torch.ones_like(full)
    out = torch.empty(batch, n, heads, value.shape[-1], dtype=query.dtype, device=device)
    full_idx = full.nonzero().flatten()
    if len(full_idx):
        full_heads(query, key, value, mask, full_idx, scale, out)
    if len(full_idx) == heads:
        return out

    if mask is None:
        padding = Padding((0,) * batch, left=True)
    else:
        padding = (plans or Plans()).get(mask, batch)
    general = not padding.left  # any mask but causal + left padding: the exact but dense path
    stream = (~full).view(kv_heads, groups)
    scratch = Scratch(device)
    for b in range(batch):
        model = mask[b if mask.shape[0] > 1 else 0, 0] if general else None
        for j in range(kv_heads):
            idx = stream[j].nonzero().flatten() + j * groups
            if len(idx):
                k, v = key[b, j].float(), value[b, j].float()
                group = Group(query[b], idx, k, v, out[b], pattern, scale, padding.starts[b])
                if general:
                    general_group(group, model)
                else:
                    streaming_group(group, block, scratch, path=path)
    return out
