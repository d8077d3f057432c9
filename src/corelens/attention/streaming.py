"""CoRe-guided hybrid attention (docs/methods.md#hybrid): a full set of heads keeps causal attention, the rest stream.

The kernels' side of the registered policy `corelens.policies.HybridAttention`, which is how hybrid attention
is applied and saved (`to_json`):

    with HybridAttention(full, sink=4, window=16, decode="stream").applied(m, prepared) as on:
        h = on.hooks[0].session
        out = m.model.generate(**prepared.inputs, cache=h.cache(), max_new_tokens=16)
        print(h.cache_report())            # bytes a DynamicCache would hold vs bytes held

Internal here: a `HybridPlan` (the full set of (layer, query head) pairs, the sink count `S` and the window
`W`, as the kernels read them) and the `Hybrid` session that runs one on one model. Inside the policy's block
every decoder attention call goes through the hybrid kernels (`corelens.attention.kernels`):
a whole-prompt prefill runs the chosen kernel (`auto`: the partitioned kernel on CUDA, the blocked CPU
path otherwise). Decoding follows `decode`: "full" (the default, as in the paper, which streams in prefill only)
runs every decoding step with the model's own attention over every cached key; "stream" runs the exact
masked path over the keys at hand, and with `h.cache()` passed to `generate`, streaming KV heads keep only
their sinks and window.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from corelens.attention import kernels
from corelens.attention.dispatch import AttentionCall, AttentionHook, Kernel
from corelens.attention.kernels.cache import HybridCache, HybridCacheLayer, decode_attention
from corelens.attention.kernels.dense import last_rows_allowed, masked_attention, policy_allowed
from corelens.attention.kernels.masks import Pattern, allowed_mask, row_starts, streaming_keep
from corelens.attention.schema import HYBRID_FORMAT, upgrade_hybrid_file
from corelens.deprecation import deprecated
from corelens.errors import CorelensError, OptionError
from corelens.metrics import kvheads
from corelens.metrics.headsets import SEEDED, k_count, select

DEFAULT_SINK = 128
DEFAULT_WINDOW = 1024
DECODES = ("full", "stream")


@dataclass(frozen=True)
class HybridPlan:
    """The kernels' plan (internal: users hold `corelens.policies.HybridAttention`, saved by its `to_json`):
    which (layer, query head) pairs keep full attention; every other head keeps S sinks + a W window."""

    full: tuple[tuple[int, int], ...]
    sink: int = DEFAULT_SINK
    window: int = DEFAULT_WINDOW
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        pairs = tuple(sorted({(int(layer), int(head)) for layer, head in self.full}))
        object.__setattr__(self, "full", pairs)
        Pattern(self.sink, self.window)  # checks sink >= 0 and window >= 1
        if any(layer < 0 or head < 0 for layer, head in pairs):
            raise OptionError("layer and head indices must be non-negative")

    @classmethod
    def from_heads(
        cls,
        heads: pd.DataFrame | str | Path,
        keep: int | float | str,
        *,
        kind: str = "top",
        seed: int | None = None,
        sink: int = DEFAULT_SINK,
        window: int = DEFAULT_WINDOW,
        random_from: str = "all",
    ) -> HybridPlan:
        """Return the plan whose full set is `keep` heads ("10%", 0.1 or a count) of a heads.csv table.

        `kind`: "top" (the CoRe heads), "bottom", "random" (from `random_from`: "all" heads or "non-top")
        or "layer-matched" (seeded), as in `corelens.metrics.headsets`. A KV-head table picks `keep` KV
        heads and keeps all their query heads full.
        """
        source: dict[str, Any] = {"keep": str(keep), "kind": kind}
        if not isinstance(heads, pd.DataFrame):
            source["heads"] = str(heads)
            heads = pd.read_csv(heads)
        count = k_count(keep, len(heads))
        if kind in SEEDED:
            seed = 0 if seed is None else seed
            source["seed"] = seed
        if kind == "random":
            source["random_from"] = random_from
        chosen = select(heads, kind, count, seed, random_from=random_from)
        # A KV-head table (`rank --granularity kv`): `keep` counts KV heads, all their query heads are full.
        if kvheads.granularity_of(heads) == "kv":
            source["granularity"] = "kv"
            chosen = kvheads.expand(chosen, kvheads.table_group(heads))
        return cls(chosen, sink, window, source)

    @property
    def pattern(self) -> Pattern:
        """Return the streaming heads' (S, W) as the kernels take it."""
        return Pattern(self.sink, self.window)

    def full_mask(self, layers: int, heads: int) -> torch.Tensor:
        """Return the (layers, heads) boolean full-head table for a model of that shape."""
        mask = torch.zeros(layers, heads, dtype=torch.bool)
        for layer, head in self.full:
            if layer >= layers or head >= heads:
                raise CorelensError(
                    f"policy head L{layer}H{head} is outside a model of {layers} x {heads} heads"
                )
            mask[layer, head] = True
        return mask

    def streaming_kv(self, layers: int, heads: int, kv_heads: int) -> torch.Tensor:
        """Return (layers, kv_heads) booleans: KV heads whose query heads all stream (they can be trimmed)."""
        return ~self.full_mask(layers, heads).view(layers, kv_heads, heads // kv_heads).any(dim=-1)

    def fraction(self, layers: int, heads: int) -> float:
        """Return the share of all query heads that are full."""
        return len(self.full) / (layers * heads)

    def ideal_speedup(self, tokens: int, layers: int, heads: int) -> float:
        """Return the ideal attention speed-up (docs/methods.md#hybrid) for an unpadded prompt of `tokens` tokens."""
        return kernels.ideal_speedup(tokens, self.fraction(layers, heads), self.sink, self.window)


def as_plan(
    full: HybridPlan | str | Path | pd.DataFrame | Iterable[tuple[int, int]] | Any,
    *,
    sink: int | None = None,
    window: int | None = None,
    keep: int | float | str | None = None,
) -> HybridPlan:
    """Return a plan from a plan, a heads.csv (+ `keep`), a head table or Ranking, or (layer, head) pairs."""
    if isinstance(full, HybridPlan):
        policy = full
    elif isinstance(full, (str, Path, pd.DataFrame)) or hasattr(full, "heads"):
        table = full.heads if hasattr(full, "heads") else full
        if keep is None:
            raise OptionError("choosing full heads from a head table needs `keep` (a count or a fraction)")
        policy = HybridPlan.from_heads(table, keep)
    else:
        policy = HybridPlan(tuple(tuple(p) for p in full))
    return HybridPlan(
        policy.full,
        policy.sink if sink is None else sink,
        policy.window if window is None else window,
        policy.source,
    )


def _model_shape(m: Any) -> tuple[list[tuple[int, torch.nn.Module]], int, int, int]:
    """Return (layer modules, layers, heads, kv heads) of a `Loaded` model or a bare transformers model."""
    if hasattr(m, "layer_modules"):
        return m.layer_modules(), m.num_layers, m.num_heads, m.num_kv_heads
    from corelens.attention.modules import decoder_attention_modules

    modules = decoder_attention_modules(m)
    config = m.config.get_text_config()
    heads = config.num_attention_heads
    return list(enumerate(modules)), len(modules), heads, config.num_key_value_heads or heads


class Hybrid:
    """An active hybrid plan on one model (`HybridAttention.session`): its hook, its caches, what ran (`stats`)."""

    def __init__(
        self,
        m: Any,
        policy: HybridPlan,
        kernel: str = "auto",
        decode: str = "full",
        dense_below: float | None = kernels.DENSE_BELOW,
    ) -> None:
        if kernel not in kernels.KERNELS:
            raise OptionError(f"unknown hybrid kernel {kernel!r}; expected one of {kernels.KERNELS}")
        if decode not in DECODES:
            raise CorelensError(f"unknown decode mode {decode!r}; expected one of {DECODES}")
        self.modules, self.layers, self.heads, self.kv_heads = _model_shape(m)
        self.policy = policy
        self.kernel = kernel
        self.decode = decode
        self.dense_below = dense_below  # the partitioned kernel's crossover (`kernels.prefill`)
        self.full = policy.full_mask(self.layers, self.heads)
        # Full decoding reads every cached key, so no KV head may be trimmed.
        stream_kv = policy.streaming_kv(self.layers, self.heads, self.kv_heads)
        self.stream_kv = stream_kv if decode == "stream" else torch.zeros_like(stream_kv)
        # Per layer: every query head of its kept (untrimmed) KV heads is full, so a one-token decoding step of
        # an unpadded prompt needs no mask over them (host bools, read here once, never in a step).
        kept = (~self.stream_kv).repeat_interleave(self.heads // self.kv_heads, dim=1)
        self.whole_full: list[bool] = (self.full | ~kept).all(dim=1).tolist()
        self.stats: Counter[str] = Counter()
        self.fallbacks: list[str] = []
        self.active = False
        # The session owns the cache it hands out: the hook reads its layer by index (`owned_layer`).
        self.plans = kernels.Plans()  # the prompt mask's padding, scanned once per forward (not per layer)
        self.last_cache: HybridCache | None = None
        self.hook = HybridHook(self)

    @contextmanager
    def running(self) -> Iterator[Hybrid]:
        """Mark the session active for the block; then close its trimmed cache (it cannot decode outside)."""
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            if self.last_cache is not None:
                self.last_cache.close()

    def cache(self) -> HybridCache:
        """Return a new cache for one `generate` call: streaming KV heads keep only sinks + window.

        Under `decode="full"` no KV head streams in decoding, so the cache keeps every key (nothing saved).
        The session owns it: a new call replaces it, and it closes when the session's block ends.
        """
        if self.last_cache is not None:
            self.last_cache.close()
        layers = [
            HybridCacheLayer(
                i,
                self.stream_kv[i].nonzero().flatten().tolist(),
                self.kv_heads,
                self.policy.sink,
                self.policy.window,
            )
            for i in range(self.layers)
        ]
        self.last_cache = HybridCache(layers)
        return self.last_cache

    def cache_report(self, cache: HybridCache | None = None) -> dict[str, float]:
        """Return the bytes a DynamicCache would hold, the bytes held and the saving, for `cache` (or the last)."""
        cache = self.last_cache if cache is None else cache
        if cache is None:
            raise CorelensError("no HybridCache yet: pass `h.cache()` to generate first")
        return cache.report()

    def owned_layer(self, call: AttentionCall) -> HybridCacheLayer | None:
        """Return this session's cache layer of the call's decoder layer when it produced the call's keys.

        A layer is `fresh` from its `update` until the hybrid kernel has read it. A forward that used another
        cache (or none) leaves it stale; a trimmed layer whose keys do not have the shape it returned was
        bypassed by something between the cache and the kernel, which the kernel cannot repair.
        """
        cache = self.last_cache
        if cache is None or call.layer >= len(cache.layers):
            return None
        layer = cache.layers[call.layer]
        if not layer.take_fresh():
            return None
        if layer.returned_shape != tuple(call.key.shape):
            if layer.trimmed:
                raise CorelensError(
                    "the keys of a trimmed HybridCache layer were replaced before the hybrid kernel ran"
                )
            return None
        return layer


class HybridHook(AttentionHook):
    """Replaces the attention kernel of every decoder layer with the hybrid one."""

    kind = "pattern"
    name = "hybrid attention"

    def __init__(self, session: Hybrid) -> None:
        self.session = session
        # (layer, device) -> the trimmed decoding's head indices (`_query_heads`)
        self._heads: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """Choose the kernel for this call: prefill, trimmed-cache decoding, or exact masked decoding."""
        s = self.session
        full = s.full[call.layer]
        layer = s.owned_layer(call)
        q_len, kv_len = call.query.shape[2], call.key.shape[2]
        if layer is not None and layer.visible is not None:
            return partial(self._trimmed, call.layer, full, layer)
        if q_len == kv_len:
            return partial(self._prefill, inner, full, layer)
        if s.decode == "full" or bool(full.all()):
            return inner  # decoding with the model's own attention over every cached key
        return partial(self._masked, full)

    # Kernels, with transformers' signature: (module, q, k, v, mask, scaling=, dropout=, ...) -> (out, None).
    def _prefill(self, inner, full, layer, module, query, key, value, attention_mask, scaling=None, **kwargs):
        s = self.session
        p = s.policy
        if bool(full.all()) or p.pattern.is_dense(query.shape[2]):
            # Every pair is kept: exactly the inner (by default the stock sdpa) call.
            out, _ = inner(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
            ran, reason = "sdpa", None
        else:
            out, ran, reason = kernels.prefill(
                s.kernel, query, key, value, attention_mask, full, p.pattern, scaling, plans=s.plans,
                dense_below=s.dense_below,
            )  # fmt: skip
        s.stats[f"prefill:{ran}"] += 1
        if reason:
            s.stats["fallback"] += 1
            if reason not in s.fallbacks:
                s.fallbacks.append(reason)
        if layer is not None:
            layer.settle(row_starts(attention_mask, query.shape[0], query.device))
        return out, None

    def _masked(self, full, module, query, key, value, attention_mask, scaling=None, **_):
        """Exact hybrid attention of the last q positions over every key (decoding with a full cache)."""
        s = self.session
        allowed = last_rows_allowed(query, key, attention_mask, full, s.policy.pattern)
        s.stats["masked"] += 1
        return masked_attention(query, key, value, allowed, scaling), None

    def _trimmed(self, index, full, layer, module, query, key, value, attention_mask, scaling=None, **_):
        """Decoding over a trimmed cache layer: full KV heads over every position, streaming ones over their slots.

        Nothing is read back to the host: the head indices come from `_query_heads` (on the device), the query
        positions from the layer's device counter, both parts run in the input dtype (`decode_attention`), and
        both parts' shapes are the same every step (the full KV heads' buffer changes only when it doubles).
        """
        s = self.session
        p = s.policy
        batch, heads, q_len, _ = query.shape
        device = query.device
        live = layer.cumulative_length  # positions seen (a host int): the buffer past them is never read
        starts = layer.starts.to(device).expand(batch)
        q_pos = (layer.next_position - q_len + torch.arange(q_len, device=device)).expand(batch, q_len)
        model = allowed_mask(attention_mask)
        out = query.new_empty(batch, q_len, heads, value.shape[-1])
        full_q, full_flags, stream_q = self._query_heads(index, layer, full, heads, device)

        if len(full_q):
            k, v = key[:, :, :live], value[:, :, :live]
            if q_len == 1 and not layer.padded and s.whole_full[index]:
                # One token over every live key, no padding, only full query heads: no mask, so sdpa takes
                # the same flash / cuDNN path as stock decoding.
                out[:, :, full_q] = decode_attention(query[:, full_q], k, v, None, scaling)
            else:
                k_pos = torch.arange(live, device=device).expand(batch, live)
                wide = None if model is None else F.pad(model, (0, live - model.shape[-1]), value=False)
                allowed = policy_allowed(full_flags, wide, q_pos, k_pos, starts, p.pattern)
                out[:, :, full_q] = decode_attention(query[:, full_q], k, v, allowed, scaling)

        sk, sv, pos = layer.visible
        allowed = streaming_keep(q_pos, pos, starts, p.pattern)  # (batch, q, slots); -1 slots excluded
        if model is not None:
            cols = pos.clamp(min=0)[:, None, :].expand(batch, q_len, pos.shape[1])
            allowed &= model[:, 0].gather(-1, cols)
        out[:, :, stream_q] = decode_attention(query[:, stream_q], sk, sv, allowed[:, None], scaling)
        s.stats["trimmed"] += 1
        return out, None

    def _query_heads(
        self, index: int, layer: HybridCacheLayer, full: torch.Tensor, heads: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return the query heads of the layer's full KV heads, their full-head flags, and the streaming KV
        heads' query heads, as device tensors built on the host once per (layer, device).

        Once per layer suffices: a session that decodes with a trimmed cache has a fixed full-head table, from
        which every cache it hands out takes its KV split (adaptive sessions decode in full).
        """
        key = (index, str(device))
        if key not in self._heads:
            offsets = torch.arange(heads // layer.kv_heads)
            full_q = (layer.full_kv[:, None] * len(offsets) + offsets).flatten()
            stream_q = (layer.stream_kv[:, None] * len(offsets) + offsets).flatten()
            self._heads[key] = (full_q.to(device), full[full_q].to(device), stream_q.to(device))
        return self._heads[key]


class _HybridPolicy(HybridPlan):
    """Deprecated `HybridPolicy` (until corelens 0.2.0): a `HybridPlan` that still writes its old file format
    (`to_dict`, `save`) and reads it as every reader does (`corelens.attention.schema.upgrade_hybrid_file`)."""

    def to_dict(self) -> dict[str, Any]:
        """Return the plan in the old file format (`corelens.hybrid-policy/1`)."""
        full = [list(p) for p in self.full]
        return {
            "format": HYBRID_FORMAT,
            "full": full,
            "sink": self.sink,
            "window": self.window,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "hybrid policy") -> HybridPlan:
        """Return the plan of an old-format dict."""
        new = upgrade_hybrid_file(data, where)
        return cls(tuple(map(tuple, new["full"])), new["sink"], new["window"], new["source"])

    def save(self, path: str | Path) -> Path:
        """Write the plan in the old file format to `path`; return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> HybridPlan:
        """Read an old-format file; a malformed one is one line naming the file and the field."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError, RecursionError) as err:
            raise CorelensError(f"{path}: cannot read a hybrid policy ({err})") from None
        return cls.from_dict(data, str(path))


def __getattr__(name: str) -> Any:
    """Serve the deprecated name `HybridPolicy` (this module's old public class) with a warning."""
    if name == "HybridPolicy":
        deprecated(
            "corelens.attention.streaming.HybridPolicy",
            "corelens.policies.HybridAttention (from_heads, to_json, Policy.from_file)",
        )
        return _HybridPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
