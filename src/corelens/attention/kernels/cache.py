"""A KV cache for hybrid decoding: streaming KV heads keep only their sinks and recent window.

A KV head is *streaming* when every query head of its group streams (docs/methods.md#hybrid, cache). Its keys and
values live in a fixed buffer of `S + W` slots per batch row: slots `0..S-1` hold the row's sinks (positions
`start + s`), slots `S..S+W-1` a ring of the `W` most recent positions (position `p` in slot `S + p % W`).
`positions` (batch, S + W) says which absolute position each slot holds, -1 for none; a position is never
held twice (a recent sink stays in its sink slot only). Keys are cached after RoPE, so evicting and
reordering them is harmless: the hybrid kernel masks by these absolute positions, exactly.

Full KV heads grow like transformers' `DynamicLayer`. Until the hybrid kernel has run one prefill on a layer
(and told it each row's first real position), the layer keeps everything, like a `DynamicLayer`; it trims
once the prompt is longer than `S + W` (shorter, the buffer would be larger than what it replaces).

`update` returns the full KV heads' keys and values (batch, full KV heads, T, dim): the sequence length is
the true number of positions seen, so masks and `q_offset` stay right; the streaming part of the call is read
by the hybrid kernel from `visible`. The data flow is one way, as in DuoAttention's (full_kv, streaming_kv): the
hybrid session that made the cache owns it and reads layer `i` at decoder layer `i`'s attention call; the
layer only marks itself `fresh` when `update` has just produced that call's keys. When the session ends it
closes the cache, and a closed cache refuses to decode trimmed heads.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from corelens.errors import CorelensError


class HybridCacheLayer(DynamicLayer):
    """One decoder layer's cache: full KV heads grow, streaming KV heads keep sinks + a ring of W positions."""

    def __init__(self, index: int, streaming: list[int], kv_heads: int, sink: int, window: int):
        super().__init__()
        self.index = index
        self.kv_heads = kv_heads
        self.stream_kv = torch.tensor(sorted(streaming), dtype=torch.long)
        self.full_kv = torch.tensor([j for j in range(kv_heads) if j not in set(streaming)], dtype=torch.long)
        self.sink, self.window = sink, window
        self.open = True  # False once the owning hybrid session has ended
        self.fresh = False  # `update` produced the keys the next attention call of this layer gets
        self.returned_shape: tuple[int, ...] | None = None
        self.cumulative_length = 0
        self.starts: torch.Tensor | None = (
            None  # (batch,) first real position per row, from the first prefill
        )
        self.trimmed = False
        self.skeys = self.svalues = self.positions = None
        self.visible: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    # --- what transformers calls -------------------------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append the new keys/values; return the full KV heads' (all positions) for the model to pass on."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        growing = self.cumulative_length + key_states.shape[-2] > self.sink + self.window
        if growing and not self.trimmed and self.starts is not None and len(self.stream_kv):
            self._trim()
        if not self.trimmed:
            keys, values = super().update(key_states, value_states)
            self.cumulative_length += key_states.shape[-2]
            self.visible = None
        else:
            if not self.open:
                raise CorelensError(
                    "this HybridCache holds trimmed heads: use it only inside its `corelens.hybrid(...)` block"
                )
            keys, values = self._update_trimmed(key_states, value_states)
        self.returned_shape, self.fresh = tuple(keys.shape), True
        return keys, values

    def get_seq_length(self) -> int:
        """Return the number of positions seen (not the number kept)."""
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Return (kv_length, kv_offset): masks address every absolute position."""
        return self.cumulative_length + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        """Crop like a DynamicLayer while untrimmed; evicted positions cannot come back once trimmed."""
        if self.trimmed:
            raise CorelensError("a trimmed HybridCache cannot be cropped (its evicted keys are gone)")
        super().crop(tokens_to_remove)
        self.cumulative_length = self.keys.shape[-2] if self.is_initialized else 0

    def reset(self) -> None:
        """Drop everything."""
        super().reset()
        self.cumulative_length = 0
        self.starts = None
        self.trimmed = False
        self.skeys = self.svalues = self.positions = self.visible = self.returned_shape = None
        self.fresh = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch (beam search)."""
        self._select(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only `indices` of the batch."""
        self._select(lambda t: t[indices])

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each batch row `repeats` times."""
        self._select(lambda t: t.repeat_interleave(repeats, dim=0))

    # --- what the hybrid session calls --------------------------------------------------------------------
    def take_fresh(self) -> bool:
        """Return whether `update` produced the current call's keys, and mark them read."""
        fresh, self.fresh = self.fresh, False
        return fresh

    def settle(self, starts: torch.Tensor) -> None:
        """Record each row's first real position (after the first prefill) and trim if the prompt is long."""
        self.starts = starts.to(torch.long)
        if len(self.stream_kv) and not self.trimmed and self.cumulative_length > self.sink + self.window:
            self._trim()

    def nbytes(self) -> int:
        """Return the bytes this layer holds (keys, values, slot positions)."""
        tensors = (self.keys, self.values, self.skeys, self.svalues, self.positions)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def dense_nbytes(self) -> int:
        """Return the bytes a DynamicLayer would hold for the same positions (all KV heads, all positions)."""
        ref = self.keys if self.keys is not None and self.keys.numel() else self.skeys
        if ref is None:
            return 0
        batch, _, _, dim = ref.shape
        dim_v = (self.values if self.values is not None and self.values.numel() else self.svalues).shape[-1]
        return batch * self.kv_heads * self.cumulative_length * (dim + dim_v) * ref.element_size()

    # --- internals ----------------------------------------------------------------------------------------
    def _select(self, fn) -> None:
        for name in ("keys", "values", "skeys", "svalues", "positions", "starts"):
            t = getattr(self, name)
            if t is not None and t.dim() and t.shape[0]:
                setattr(self, name, fn(t))

    def _trim(self) -> None:
        """Move the streaming KV heads of the stored positions into the sink + ring buffer."""
        keys, values = self.keys, self.values
        batch, _, total, _ = keys.shape
        device = keys.device
        sink, window = self.sink, self.window
        stream, full = self.stream_kv.to(device), self.full_kv.to(device)
        starts = self.starts.to(device).expand(batch)
        ks, vs = keys.index_select(1, stream), values.index_select(1, stream)
        slots = sink + window
        self.skeys = ks.new_zeros(batch, len(stream), slots, ks.shape[-1])
        self.svalues = vs.new_zeros(batch, len(stream), slots, vs.shape[-1])
        self.positions = torch.full((batch, slots), -1, dtype=torch.long, device=device)
        sink_pos = starts[:, None] + torch.arange(sink, device=device)  # (batch, S)
        ok = sink_pos < total
        idx = sink_pos.clamp(max=total - 1)
        gather = idx[:, None, :, None]
        self.skeys[:, :, :sink] = ks.gather(2, gather.expand(-1, ks.shape[1], -1, ks.shape[-1]))
        self.svalues[:, :, :sink] = vs.gather(2, gather.expand(-1, vs.shape[1], -1, vs.shape[-1]))
        self.positions[:, :sink] = torch.where(ok, sink_pos, -1)
        recent = torch.arange(max(0, total - window), total, device=device)
        ring = sink + recent % window
        self.skeys[:, :, ring] = ks[:, :, recent]
        self.svalues[:, :, ring] = vs[:, :, recent]
        self.positions[:, ring] = torch.where(recent[None] >= starts[:, None] + sink, recent[None], -1)
        self.keys, self.values = keys.index_select(1, full), values.index_select(1, full)
        self.trimmed = True

    def _write(self, ks: torch.Tensor, vs: torch.Tensor, first: int) -> None:
        """Store new positions first.. (keys (batch, streaming, q, dim)) in the sink slots and the ring."""
        q = ks.shape[2]
        device = ks.device
        sink, window = self.sink, self.window
        starts = self.starts.to(device).expand(ks.shape[0])
        keep = max(0, q - window)  # older new positions would be overwritten within this very write
        for t in range(keep, q):
            p = first + t
            slot = sink + p % window
            self.skeys[:, :, slot] = ks[:, :, t]
            self.svalues[:, :, slot] = vs[:, :, t]
            self.positions[:, slot] = torch.where(p >= starts + sink, p, -1)
        for t in range(q):
            p = first + t
            s = p - starts  # sink index per row
            rows = ((s >= 0) & (s < sink)).nonzero().flatten()
            if len(rows):
                self.skeys[rows, :, s[rows]] = ks[rows, :, t]
                self.svalues[rows, :, s[rows]] = vs[rows, :, t]
                self.positions[rows, s[rows]] = p

    def _update_trimmed(self, key_states: torch.Tensor, value_states: torch.Tensor):
        device = key_states.device
        stream, full = self.stream_kv.to(device), self.full_kv.to(device)
        first = self.cumulative_length
        q = key_states.shape[-2]
        ks, vs = key_states.index_select(1, stream), value_states.index_select(1, stream)
        self.keys = torch.cat([self.keys, key_states.index_select(1, full)], dim=-2)
        self.values = torch.cat([self.values, value_states.index_select(1, full)], dim=-2)
        if q == 1:  # the ring then holds exactly the window of the new query: write first, no copy
            self._write(ks, vs, first)
            self.visible = (self.skeys, self.svalues, self.positions)
        else:  # earlier queries of this step need positions the write would evict: show old + new
            new_pos = torch.arange(first, first + q, device=device).expand(ks.shape[0], q)
            self.visible = (
                torch.cat([self.skeys, ks], dim=2),
                torch.cat([self.svalues, vs], dim=2),
                torch.cat([self.positions, new_pos], dim=1),
            )
            self._write(ks, vs, first)
        self.cumulative_length += q
        return self.keys, self.values


class HybridCache(Cache):
    """The cache to pass to `generate(..., cache=...)` inside a `corelens.hybrid(...)` block."""

    def __init__(self, layers: list[HybridCacheLayer]) -> None:
        super().__init__(layers=layers)

    def close(self) -> None:
        """Mark the cache as outside its session (called by the session that owns it)."""
        for layer in self.layers:
            layer.open = False

    def nbytes(self) -> int:
        """Return the bytes held by all layers."""
        return sum(layer.nbytes() for layer in self.layers)

    def dense_nbytes(self) -> int:
        """Return the bytes a DynamicCache would hold for the same positions."""
        return sum(layer.dense_nbytes() for layer in self.layers)

    def report(self) -> dict[str, float]:
        """Return dense bytes, held bytes, bytes saved and the saved fraction."""
        dense, held = self.dense_nbytes(), self.nbytes()
        return {
            "dense_bytes": dense,
            "hybrid_bytes": held,
            "saved_bytes": dense - held,
            "saved_fraction": (dense - held) / dense if dense else 0.0,
        }
