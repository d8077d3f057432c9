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

A decoding step over a trimmed layer reads nothing back to the host: the head indices live on the cache's
device from the trim on, the next position is a device counter (`next_position`), ring slots and sink slots
are computed and written on the device (`index_copy_`, `scatter_`), and `decode_attention` runs in the input
dtype. The streaming part has the same shapes at every step (S + W slots). From the trim on, the full KV heads
live in a preallocated buffer (`keys` / `values`, `capacity` positions, zeros past the positions seen) written
in place at the device counter; it grows by whole `CHUNK`s. `update` returns the whole buffer; the hybrid
kernel attends over the live positions only (`cumulative_length`, a host int: a view of the buffer's first
positions), and for a one-token step of an unpadded prompt whose full KV heads hold only full query heads with
no mask at all, so that flash / cuDNN split the keys as they do for stock decoding (`HybridHook._trimmed`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from corelens.errors import CorelensError

# The full KV heads' buffer grows in chunks of this many positions (the trim leaves one chunk of room): one
# copy per CHUNK tokens, and no step whose buffer doubles (a long pause and twice the memory at once).
CHUNK = 1024


class HybridCacheLayer(DynamicLayer):
    """One decoder layer's cache: full KV heads grow, streaming KV heads keep sinks + a ring of W positions."""

    def __init__(self, index: int, streaming: list[int], kv_heads: int, sink: int, window: int):
        super().__init__()
        self.index = index
        self.kv_heads = kv_heads
        self.stream_kv = torch.tensor(sorted(streaming), dtype=torch.long)
        self.full_kv = torch.tensor([j for j in range(kv_heads) if j not in set(streaming)], dtype=torch.long)
        self.sink, self.window = sink, window
        self.padded = False  # some row starts after position 0 (left padding), from `settle`
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
        self.next_position: torch.Tensor | None = None  # (1,) on the device: the next absolute position
        # The (streaming, full) KV head indices, on the device from the trim on.
        self.indices: tuple[torch.Tensor, torch.Tensor] | None = None

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
                    "this HybridCache holds trimmed heads: use it only inside its hybrid policy's block"
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
        self.padded = False
        self.trimmed = False
        self.skeys = self.svalues = self.positions = self.visible = self.returned_shape = None
        self.next_position = self.indices = None
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
        self.padded = bool(self.starts.any())  # read once per prefill, never per decoding step
        if len(self.stream_kv) and not self.trimmed and self.cumulative_length > self.sink + self.window:
            self._trim()

    def nbytes(self) -> int:
        """Return the bytes this layer holds for its positions (keys, values, slot positions); the unused
        tail of a trimmed layer's buffer is `reserved_nbytes`."""
        held = [self.keys, self.values]
        if self.trimmed:  # the positions seen, not the buffer's headroom
            held = [t[:, :, : self.cumulative_length] for t in held]
        tensors = (*held, self.skeys, self.svalues, self.positions)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def reserved_nbytes(self) -> int:
        """Return the bytes allocated past the positions seen (the trimmed full KV heads' headroom)."""
        if not self.trimmed:
            return 0
        return sum(
            t[:, :, self.cumulative_length :].numel() * t.element_size() for t in (self.keys, self.values)
        )

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
        # Copied to the device once here, so that no decoding step copies from the host (a copy that waits).
        self.indices = stream, full = self.stream_kv.to(device), self.full_kv.to(device)
        self.next_position = torch.full((1,), total, dtype=torch.long, device=device)
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
        self.keys, self.values = (
            self._buffer(keys.index_select(1, full)),
            self._buffer(values.index_select(1, full)),
        )
        self.trimmed = True

    @property
    def capacity(self) -> int:
        """Return the positions the full KV heads' buffer holds room for (after the trim)."""
        return self.keys.shape[-2]

    @staticmethod
    def _buffer(held: torch.Tensor, room: int | None = None) -> torch.Tensor:
        """Return `held` (batch, heads, T, dim) in a zeroed buffer of T + room positions (zeros: no NaN in the
        masked tail, whose weights are exactly 0)."""
        room = CHUNK if room is None else room
        out = held.new_zeros(*held.shape[:2], held.shape[2] + room, held.shape[3])
        out[:, :, : held.shape[2]] = held
        return out

    def _reserve(self, needed: int) -> None:
        """Grow the full KV heads' buffer by whole `CHUNK`s until it holds `needed` positions (host ints)."""
        if self.capacity < needed:
            room = -(-(needed - self.capacity) // CHUNK) * CHUNK
            self.keys, self.values = self._buffer(self.keys, room), self._buffer(self.values, room)

    def _write(self, ks: torch.Tensor, vs: torch.Tensor) -> None:
        """Store the step's new positions (keys (batch, streaming, q, dim)) in the ring and the sink slots.

        Device work only, on shapes fixed by q: the positions come from the device counter `next_position`.
        """
        q = ks.shape[2]
        device = ks.device
        sink, window = self.sink, self.window
        starts = self.starts.to(device).expand(ks.shape[0])
        pos = self.next_position + torch.arange(q, device=device)  # (q,) absolute positions
        keep = max(0, q - window)  # older new positions would be overwritten within this very write
        slots = sink + pos[keep:] % window  # distinct: at most W consecutive positions
        self.skeys.index_copy_(2, slots, ks[:, :, keep:])
        self.svalues.index_copy_(2, slots, vs[:, :, keep:])
        ring = pos[None, keep:].expand(len(starts), -1)
        self.positions.index_copy_(1, slots, torch.where(ring >= (starts + sink)[:, None], ring, -1))
        if sink:  # a row whose first real position is recent still fills its sinks
            for t in range(q):
                self._write_sink(ks[:, :, t : t + 1], vs[:, :, t : t + 1], pos[t], starts)
        self.next_position += q

    def _write_sink(self, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor, starts: torch.Tensor) -> None:
        """Put position `p` (a 0-d device tensor) in sink slot p - start of the rows where that is a sink slot.

        Every row writes (the slot clamped, its old content kept where p is no sink): no row list is read back.
        """
        s = p - starts  # (batch,) sink index of p in each row
        inside = (s >= 0) & (s < self.sink)
        slot = s.clamp(0, self.sink - 1)
        for store, new in ((self.skeys, k), (self.svalues, v)):
            index = slot[:, None, None, None].expand(-1, store.shape[1], 1, store.shape[3])
            store.scatter_(2, index, torch.where(inside[:, None, None, None], new, store.gather(2, index)))
        index = slot[:, None]
        self.positions.scatter_(1, index, torch.where(inside[:, None], p, self.positions.gather(1, index)))

    def _update_trimmed(self, key_states: torch.Tensor, value_states: torch.Tensor):
        device = key_states.device
        if self.indices[0].device != device:  # the layer moved since the trim (once, not per step)
            self.indices = tuple(t.to(device) for t in self.indices)
            self.next_position = self.next_position.to(device)
        stream, full = self.indices
        first = self.cumulative_length
        q = key_states.shape[-2]
        ks, vs = key_states.index_select(1, stream), value_states.index_select(1, stream)
        self._reserve(first + q)
        at = self.next_position + torch.arange(q, device=device)  # the device counter: no host offset
        self.keys.index_copy_(2, at, key_states.index_select(1, full))
        self.values.index_copy_(2, at, value_states.index_select(1, full))
        if q == 1:  # the ring then holds exactly the window of the new query: write first, no copy
            self._write(ks, vs)
            self.visible = (self.skeys, self.svalues, self.positions)
        else:  # earlier queries of this step need positions the write would evict: show old + new
            new_pos = torch.arange(first, first + q, device=device).expand(ks.shape[0], q)
            self.visible = (
                torch.cat([self.skeys, ks], dim=2),
                torch.cat([self.svalues, vs], dim=2),
                torch.cat([self.positions, new_pos], dim=1),
            )
            self._write(ks, vs)
        self.cumulative_length += q
        return self.keys, self.values


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float | None,
) -> torch.Tensor:
    """Return attention (batch, q, heads, dim) of a decoding step under `allowed` (broadcastable to
    (batch, heads, q, n); None: every key, no mask), in the input dtype: no fp32 copy of the cache.

    Each KV head's query heads are folded into the query axis, so SDPA reads every key and value once per KV
    head, unrepeated and uncast, and its kernels accumulate the softmax in fp32. Every row of a decoding step
    keeps at least its own position, so no row is fully masked (where SDPA backends differ).
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, n = key.shape[1], key.shape[2]
    folded = query.reshape(batch, kv_heads, heads // kv_heads * q_len, dim)
    mask = None if allowed is None else allowed.expand(batch, heads, q_len, n).reshape(batch, kv_heads, -1, n)
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scale)
    return out.view(batch, heads, q_len, value.shape[-1]).transpose(1, 2)


class HybridCache(Cache):
    """The cache to pass to `generate(..., cache=...)` inside a `HybridAttention(...).applied(...)` block."""

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
        """Return dense bytes, held bytes, bytes saved, the saved fraction, and the buffers' headroom."""
        dense, held = self.dense_nbytes(), self.nbytes()
        return {
            "dense_bytes": dense,
            "hybrid_bytes": held,
            "saved_bytes": dense - held,
            "saved_fraction": (dense - held) / dense if dense else 0.0,
            "reserved_bytes": sum(layer.reserved_nbytes() for layer in self.layers),
        }
