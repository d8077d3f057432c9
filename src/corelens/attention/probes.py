"""Probes: read attention rows inside the attention function, never an N x N matrix.

`RamProbe` computes, for a few query rows, the fp32 attention probabilities of every query head over all
keys (from the post-RoPE queries and keys the model uses, GQA-aware, with the model's causal/padding mask),
and reduces them to the mass on the target set Omega and on the visual set V.

`TopKeyProbe` (the retrieval score's top-1 key in Omega) and `OutsideWindowProbe` (the mass outside sink +
window) reduce the same rows to one value per head.

All probe rows of a layer run as one batched computation, cut into chunks of rows by a byte budget on the
fp32 scores (`chunk_bytes`), with nothing read back to the host until the layer's totals are complete.
"""

from __future__ import annotations

import abc

import torch

from corelens.attention.dispatch import AttentionCall, AttentionHook
from corelens.attention.prompt_context import AttentionContext, needs
from corelens.errors import CorelensError

# Byte budget of the fp32 scores materialised at once, per device type. On the CPU 4 MiB (2**20 scores), as
# small blocks matter there for peak memory: glibc keeps freed heap blocks under its mmap threshold. On CUDA
# up to 256 MiB, never more than an eighth of what the allocator could still hand out: 32 rows x 28 heads x
# 32k keys (117 MiB) then run in one chunk, at 128k in two, well below the stock MLP's activations.
CPU_CHUNK_BYTES = 4 << 20
CUDA_CHUNK_BYTES = 256 << 20
# Keys upcast to fp32 at once for a half-precision K (bytes of the fp32 block): K is never copied whole.
_KEY_BLOCK_BYTES = 32 << 20


def chunk_bytes(device: torch.device) -> int:
    """Return the byte budget of one chunk of fp32 scores on `device` (see CPU_CHUNK_BYTES / CUDA_CHUNK_BYTES)."""
    if device.type != "cuda":
        return CPU_CHUNK_BYTES  # the CPU allocator's bound (and any other device's: no free-memory query)
    free, _ = torch.cuda.mem_get_info(device)  # a driver query: it does not wait for queued work
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return max(CPU_CHUNK_BYTES, min(CUDA_CHUNK_BYTES, (free + cached) // 8))


def rows_per_chunk(heads: int, kv_len: int, budget: int) -> int:
    """Return how many query rows' fp32 scores (heads x kv_len each) fit `budget` bytes (at least 1)."""
    return max(1, budget // (4 * heads * kv_len))


def _check_rows(rows: torch.Tensor, q_offset: int, q_len: int) -> None:
    """Raise when host `rows` fall outside the call's queries (device rows are the caller's to keep in range)."""
    if rows.device.type != "cpu" or not len(rows):
        return  # reading device rows back would wait for the device; an index out of range still fails there
    if int(rows.min()) < q_offset or int(rows.max()) >= q_offset + q_len:
        raise ValueError(f"probe rows {rows.tolist()} are outside this call's queries")


def _grouped_scores(q: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Return fp32 q . k over every key: q (batch, kv_heads, groups, rows, dim) fp32, key (batch, kv_heads, n, dim).

    An fp32 K is used in place. A half-precision K is upcast one block of keys at a time (`_KEY_BLOCK_BYTES`),
    so the products are exact and accumulate in fp32 without an fp32 copy of all of K.
    """
    if key.dtype == torch.float32:
        return torch.einsum("bkgrd,bknd->bkgrn", q, key)
    batch, kv_heads, groups, n_rows, dim = q.shape
    kv_len = key.shape[2]
    scores = q.new_empty(batch, kv_heads, groups, n_rows, kv_len)
    block = max(1, _KEY_BLOCK_BYTES // (4 * batch * kv_heads * (dim + groups * n_rows)))
    for start in range(0, kv_len, block):
        keys = key[:, :, start : start + block].float()
        scores[..., start : start + block] = torch.einsum("bkgrd,bknd->bkgrn", q, keys)
    return scores


def row_scores(call: AttentionCall, rows: torch.Tensor) -> torch.Tensor:
    """Return fp32 masked, scaled scores of query `rows` (absolute positions): (batch, heads, rows, kv_len).

    `rows` may live on the host or on the call's device; device rows are not read back (no host sync).
    """
    _check_rows(rows, call.q_offset, call.query.shape[2])
    return _scores(call, rows.to(call.query.device))


def _scores(call: AttentionCall, rows: torch.Tensor) -> torch.Tensor:
    """`row_scores` of `rows` already on the call's device and in range: nothing is read back to the host."""
    query, key = call.query, call.key
    batch, heads, _, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    local = rows - call.q_offset
    q = query[:, :, local].float().view(batch, kv_heads, heads // kv_heads, len(rows), dim)
    scores = _grouped_scores(q, key).mul_(call.scaling)
    scores = scores.reshape(batch, heads, len(rows), kv_len)
    mask = call.attention_mask
    if mask is None:
        keys = torch.arange(kv_len, device=key.device)
        allowed = keys[None, :] <= rows[:, None]
        scores.masked_fill_(~allowed, float("-inf"))
    else:
        rows_mask = mask[:, :, local, :kv_len]
        if rows_mask.dtype == torch.bool:
            scores.masked_fill_(~rows_mask, float("-inf"))
        else:
            scores.add_(rows_mask.float())
    return scores


def row_probabilities(call: AttentionCall, rows: torch.Tensor) -> torch.Tensor:
    """Return fp32 attention probabilities of query `rows` (absolute positions): (batch, heads, rows, kv_len)."""
    return _softmax_(row_scores(call, rows))


def _softmax_(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension in place: no second (heads, rows, kv_len) buffer."""
    scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
    return scores.div_(scores.sum(dim=-1, keepdim=True))


class _Sets:
    """One prompt's probe rows, Omega, V and views (CPU long tensors) and the device copies made from them.

    A probe built with tensors holds one; a probe built without keeps one per prompt with the prompt's
    context (`AttentionContext.derived`), so its device copies are made once per prompt and device.
    """

    def __init__(self, rows: torch.Tensor, omega: torch.Tensor, visual: torch.Tensor, views=None) -> None:
        self.rows = rows.long()
        self.omega = omega.long()
        self.visual = visual.long()
        self.views = [v.long() for v in views or []]
        self._rows_on: torch.Tensor | None = None
        self._indicator: torch.Tensor | None = None

    @classmethod
    def of(cls, context: AttentionContext, views: bool) -> _Sets:
        """Return the sets the prompt's context names (`views`: also the layout's views)."""
        if context.query_rows is None:
            raise CorelensError("a probe built without rows needs the context's `query_rows`")
        layout_views = context.layout.views() if views else []
        return cls(
            context.query_rows,
            context.omega,
            context.visual,
            [torch.as_tensor(tokens, dtype=torch.long) for _, tokens in layout_views],
        )

    def device_rows(self, device: torch.device) -> torch.Tensor:
        """Return the probe rows on `device`, copied there once (not per layer)."""
        if self._rows_on is None or self._rows_on.device != device:
            self._rows_on = self.rows.to(device)
        return self._rows_on

    def indicators(self, kv_len: int, device: torch.device) -> torch.Tensor:
        # 0/1 columns marking Omega and V: one matmul reduces a block of rows to both masses.
        if self._indicator is None or self._indicator.device != device:
            indicator = torch.zeros(kv_len, 2)
            indicator[self.omega, 0] = 1.0
            indicator[self.visual, 1] = 1.0
            self._indicator = indicator.to(device)
        return self._indicator

    def view_columns(self, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(key, column) pairs: view i's keys go to column 2i, its keys in Omega to column 2i + 1.

        As long as the views' tokens together, never keys x views: a sample of many pages stays linear.
        """
        in_omega = torch.zeros(kv_len, dtype=torch.bool)
        in_omega[self.omega] = True
        keys, columns = [], []
        for i, view in enumerate(self.views):
            view = torch.unique(view)  # a key counts once per view, as a 0/1 indicator would
            inside = view[in_omega[view]]
            keys += [view, inside]
            columns += [torch.full_like(view, 2 * i), torch.full_like(inside, 2 * i + 1)]
        if not keys:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        return torch.cat(keys), torch.cat(columns)


def _prefill(call: AttentionCall, seq_len: int | None) -> bool:
    """Return whether the call holds the whole sequence as queries: `seq_len` tokens, or (None) any prefill."""
    q_len, kv_len = call.query.shape[2], call.key.shape[2]
    if seq_len is None:
        return q_len == kv_len  # a decoding step has fewer queries than keys
    return q_len == seq_len and kv_len == seq_len


class RamProbe(AttentionHook):
    """Records, per layer and query head, the mean mass of `rows` on `omega` and on `visual` (fp32).

    With `views` (token positions of each view, e.g. `Layout.views()`), `view_mass` (layers, heads, views, 2)
    also holds each view's mass and its mass on Ω ∩ view.

    Built without `rows` (and `omega`, `visual`, `seq_len`), the probe reads them from the attention call's
    context (`attention_context(AttentionContext.of(prepared, omega=..., query_rows=...))`, `views=True`:
    the layout's views) and measures each prompt it sees anew: one probe serves every prompt of a run.
    """

    reads = "scores"
    name = "RAM probe"

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        rows: torch.Tensor | None = None,
        omega: torch.Tensor | None = None,
        visual: torch.Tensor | None = None,
        seq_len: int | None = None,
        views: list[torch.Tensor] | bool | None = None,
    ) -> None:
        self.shape = (num_layers, num_heads)
        self.seq_len = seq_len
        self._context: AttentionContext | None = None
        if rows is None:  # the positions come with each call's context
            self._fixed = None
            self._views = bool(views)
            self._reset(_Sets(torch.zeros(0), torch.zeros(0), torch.zeros(0)))
            return
        if omega is None or visual is None or seq_len is None or isinstance(views, bool):
            raise ValueError("a RamProbe built with rows needs omega, visual, seq_len (and views as tensors)")
        self._fixed = _Sets(rows, omega, visual, views)
        self._reset(self._fixed)

    def _reset(self, sets: _Sets) -> None:
        """Make `sets` the measured prompt's and clear the results (NaN until a layer is measured)."""
        self._sets = sets
        self.rows, self.omega, self.visual, self.views = sets.rows, sets.omega, sets.visual, sets.views
        self.mass = torch.full(self.shape, float("nan"))
        self.visual_mass = torch.full(self.shape, float("nan"))
        self.view_mass = torch.full((*self.shape, len(self.views), 2), float("nan"))

    def _sets_for(self, call: AttentionCall) -> _Sets:
        """Return the call's prompt's sets; a new prompt's context clears the last prompt's results."""
        if self._fixed is not None:
            return self._fixed
        context = needs(call.context, self.name)
        if context is not self._context:
            self._context = context
            self._reset(context.derived(("RamProbe", self._views), lambda: _Sets.of(context, self._views)))
        return self._sets

    def pre(self, call: AttentionCall) -> None:
        """Measure on the forward that holds the whole sequence as queries (the prefill); skip others."""
        if not _prefill(call, self.seq_len):
            return
        if call.query.shape[0] != 1:
            raise ValueError("RamProbe measures one sample at a time (batch size 1)")
        sets = self._sets_for(call)
        heads, kv_len = call.query.shape[1], call.key.shape[2]
        device = call.key.device
        _check_rows(sets.rows, call.q_offset, call.query.shape[2])  # on the host, once per layer
        step = rows_per_chunk(heads, kv_len, chunk_bytes(device))
        rows = sets.device_rows(device)
        indicator = sets.indicators(kv_len, device)
        totals = torch.zeros(heads, indicator.shape[1], device=device)
        # Per-key mass summed over the probed rows: the views' masses are sums of its entries.
        per_key = torch.zeros(heads, kv_len, device=device) if sets.views else None
        for start in range(0, len(rows), step):  # device work only: nothing is read back per chunk
            probs = _softmax_(_scores(call, rows[start : start + step]))[0]  # (heads, rows, kv)
            totals += (probs @ indicator).sum(dim=1)
            if per_key is not None:
                per_key += probs.sum(dim=1)
        totals = totals.cpu() / len(sets.rows)  # the layer's one copy to the host
        self.mass[call.layer] = totals[:, 0]
        self.visual_mass[call.layer] = totals[:, 1]
        if per_key is not None:
            keys, columns = sets.view_columns(kv_len)
            views = torch.zeros(heads, 2 * len(sets.views), device=device)
            views.index_add_(1, columns.to(device), per_key[:, keys.to(device)])
            self.view_mass[call.layer] = (views.cpu() / len(sets.rows)).reshape(heads, len(sets.views), 2)


class KeyMapProbe(AttentionHook):
    """Records, for chosen (layer, query head) pairs, the mean attention of `rows` over every key (fp32).

    Built without `rows` and `seq_len`, it reads the rows from each call's context (`query_rows`) and keeps
    the maps of the last prompt it saw.
    """

    reads = "scores"
    name = "key-map probe"

    def __init__(
        self, heads: list[tuple[int, int]], rows: torch.Tensor | None = None, seq_len: int | None = None
    ) -> None:
        self.heads = [(int(layer), int(head)) for layer, head in heads]
        self.rows = None if rows is None else rows.long()
        self._fixed = rows is not None  # built with rows: every call probes them
        self.seq_len = seq_len
        self._context: AttentionContext | None = None
        self.maps: dict[tuple[int, int], torch.Tensor] = {}

    def _rows_for(self, call: AttentionCall) -> torch.Tensor:
        """Return the probed rows: the constructor's, or the call's prompt's (a new prompt clears the maps)."""
        if self._fixed:
            return self.rows
        context = needs(call.context, self.name)
        if context.query_rows is None:
            raise CorelensError("a key-map probe built without rows needs the context's `query_rows`")
        if context is not self._context:
            self._context, self.rows, self.maps = context, context.query_rows, {}
        return self.rows

    def pre(self, call: AttentionCall) -> None:
        """Average the probed rows' attention of this layer's chosen heads (prefill only)."""
        wanted = [h for layer, h in self.heads if layer == call.layer]
        if not wanted or not _prefill(call, self.seq_len):
            return
        probs = row_probabilities(call, self._rows_for(call))[0]  # (heads, rows, kv)
        for head in wanted:
            self.maps[(call.layer, head)] = probs[head].mean(0).cpu()


class _RowProbe(AttentionHook, abc.ABC):
    """A probe of the context's `query_rows` on the prefill: `reduce(call, probs or scores)` fills one
    (heads,) value per layer of `values` (NaN until a layer is measured); a new prompt clears them."""

    reads = "scores"
    softmax = True  # whether `reduce` reads probabilities (else the masked scores)

    def __init__(self, num_layers: int, num_heads: int) -> None:
        self.shape = (num_layers, num_heads)
        self._context: AttentionContext | None = None
        self.values = torch.full(self.shape, float("nan"))

    @abc.abstractmethod
    def reduce(self, call: AttentionCall, rows: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """Return (heads,) summed over a block of `rows` (`block`: (heads, rows, kv_len))."""

    def pre(self, call: AttentionCall) -> None:
        """Measure the probed rows, one chunk of rows at a time, on the prefill; skip decoding steps."""
        if not _prefill(call, None):
            return
        if call.query.shape[0] != 1:
            raise ValueError(f"the {self.name} measures one sample at a time (batch size 1)")
        context = needs(call.context, self.name)
        if context.query_rows is None:
            raise CorelensError(f"the {self.name} needs the context's `query_rows`")
        if context is not self._context:
            self._context = context
            self.values = torch.full(self.shape, float("nan"))
        rows = torch.as_tensor(context.query_rows, dtype=torch.long)
        _check_rows(rows, call.q_offset, call.query.shape[2])
        heads, kv_len = call.query.shape[1], call.key.shape[2]
        device = call.key.device
        on = rows.to(device)
        step = rows_per_chunk(heads, kv_len, chunk_bytes(device))
        total = torch.zeros(heads, device=device)
        for start in range(0, len(rows), step):
            scores = _scores(call, on[start : start + step])
            block = _softmax_(scores) if self.softmax else scores
            total += self.reduce(call, on[start : start + step], block[0])
        self.values[call.layer] = total.cpu() / len(rows)


class TopKeyProbe(_RowProbe):
    """Records, per layer and query head, the share of the context's `query_rows` whose top-1 key (the
    highest score, the first on a tie) lies in the context's Omega: the retrieval score's hit rate."""

    name = "top-key probe"
    softmax = False  # the top key of the scores is the top key of the probabilities

    def reduce(self, call: AttentionCall, rows: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        inside = torch.zeros(block.shape[-1], dtype=torch.bool, device=block.device)
        inside[torch.as_tensor(call.context.omega, dtype=torch.long, device=block.device)] = True
        return inside[block.argmax(dim=-1)].float().sum(dim=1)


class OutsideWindowProbe(_RowProbe):
    """Records, per layer and query head, the mean attention mass of the context's `query_rows` outside the
    first `sink` keys and the `window` latest keys (row r keeps keys < sink and r - window < key <= r): the
    mass a streaming head with S = `sink`, W = `window` loses. Set `sink` / `window` before each forward."""

    name = "outside-window probe"

    def __init__(self, num_layers: int, num_heads: int, sink: int = 0, window: int = 1) -> None:
        super().__init__(num_layers, num_heads)
        self.sink, self.window = sink, window

    def reduce(self, call: AttentionCall, rows: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        keys = torch.arange(block.shape[-1], device=block.device)
        lost = (keys[None, :] >= self.sink) & (keys[None, :] <= rows[:, None] - self.window)  # (rows, kv)
        return (block * lost[None]).sum(dim=(1, 2))
