"""What the streaming paths share: one streaming group (`Group`), scratch memory and the tile loop.

Every path (`band`, `split`, `masked`) implements one function, `attend(group, block, scratch)`, that writes
the rows of `group` past its prefix (`Group.end` .. n - 1). Per call, no large temporary is allocated: fresh
multi-megabyte tensors cost more in page faults than their arithmetic on the CPU, so every sdpa call's
output stays under `OUT_BYTES` and the tiles reuse `Scratch` buffers.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property

import torch

from corelens.attention.kernels.masks import Pattern

NEG_INF = float("-inf")
CHUNK_BYTES = 96 << 20  # key + value tiles per sdpa call: few calls (each a parallel region)
# Outputs of one sdpa call at most: glibc serves blocks above 32 MB with fresh mmap'ed pages, and their page
# faults cost more than the call's arithmetic saves; smaller blocks are reused from the heap
# (benchmarks/README.md#hybrid-kernel-constants).
OUT_BYTES = 16 << 20


@dataclass(frozen=True, eq=False)
class Group:
    """The streaming query heads of one batch row that share one KV head: what a streaming path computes."""

    query: torch.Tensor  # (heads, n, dim): all query heads of the row, any dtype
    heads: torch.Tensor  # (g,) the group's query heads, sorted
    key: torch.Tensor  # (n, dim) fp32: their KV head
    value: torch.Tensor  # (n, dim_v) fp32
    out: torch.Tensor  # (n, heads, dim_v): the row's output, written in place
    pattern: Pattern
    scale: float
    start: int = 0  # the row's first real position (left padding before it)

    @property
    def n(self) -> int:
        return self.key.shape[0]

    @property
    def end(self) -> int:
        """Return the first query past the prefix (`Pattern.prefix_end`)."""
        return self.pattern.prefix_end(self.start, self.n)

    @cached_property
    def runs(self) -> list[tuple[int, int, int]]:
        """Runs of consecutive heads, read and written through views (`head_runs`)."""
        return head_runs(self.heads)

    def write(self, r0: int, rows: torch.Tensor) -> None:
        """Write `rows` (r, g, dim_v) into output rows r0 .. r0 + r - 1 of the group's heads."""
        for i, j, h in self.runs:
            self.out[r0 : r0 + len(rows), h : h + j - i] = rows[:, i:j]


def head_runs(heads: torch.Tensor) -> list[tuple[int, int, int]]:
    """Return the runs of consecutive heads in sorted `heads` as (first stacked index, end, first head)."""
    h = heads.tolist()
    cuts = [0] + [i for i in range(1, len(h)) if h[i] != h[i - 1] + 1] + [len(h)]
    return [(i, j, h[i]) for i, j in zip(cuts[:-1], cuts[1:])]


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


def additive(ok: torch.Tensor, groups: int) -> torch.Tensor:
    """Return the (1, 1, groups * B, keys) additive mask of (B, keys) booleans, rows repeated per head."""
    block, keys = ok.shape
    bias = torch.zeros(1, 1, groups, block, keys, device=ok.device)
    bias.masked_fill_(~ok[None, None, None], NEG_INF)
    return bias.view(1, 1, groups * block, keys)


class Tiles(ABC):
    """The tiles of one streaming group past its prefix: tile t holds queries end + t B .. end + t B + B - 1.

    A subclass sets `per_call` (tiles per sdpa call) and implements `attend`.
    """

    per_call: int

    def __init__(self, group: Group, block: int, scratch: Scratch) -> None:
        self.group, self.block, self.scratch = group, block, scratch
        self.k, self.v, self.end = group.key, group.value, group.end
        self.sink = group.pattern.sink
        self.groups = len(group.heads)
        self.count = math.ceil((group.n - self.end) / block)
        self.rows = self.groups * block

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
        start = self.group.start
        out = self.scratch.get(name, self.per_call, 1, keys, src.shape[1])
        out[:, 0, : self.sink] = src[start : start + self.sink]
        return out

    @abstractmethod
    def attend(self, qv: torch.Tensor, t0: int, t1: int, into=None) -> torch.Tensor | None:
        """Return the (m, 1, g B, dim_v) outputs of tiles t0 .. t1 - 1 for their stacked queries `qv`.

        With `into` (where the path supports it), pairs of (first stacked head i, an fp32 (m, heads, B, dim_v)
        view of the output for the stacked heads i ..): the outputs are written there and None returned.
        Each path (split.py, masked.py) implements it.
        """

    def run(self, direct: bool = False) -> None:
        """Stack each chunk of tiles' queries, attend, and write the rows end .. n - 1 of the group.

        `direct`: whole chunks hand `attend` views of the output to write into (no copy).
        """
        g, b, scratch = self.groups, self.block, self.scratch
        query, out, n, end = self.group.query, self.group.out, self.group.n, self.end
        dim, dim_v = query.shape[-1], self.v.shape[-1]
        runs = self.group.runs
        qt = scratch.get("q", self.per_call, g, b, dim)
        for t0 in range(0, self.count, self.per_call):
            t1 = min(self.count, t0 + self.per_call)
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
                self.attend(qv, t0, t1, into=into)
                continue
            ob = self.attend(qv, t0, t1)
            self.group.write(r0, ob.view(m, g, b, dim_v).transpose(1, 2).reshape(m * b, g, dim_v)[: r1 - r0])
