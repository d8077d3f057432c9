"""The one attention function corelens registers with transformers, and the hooks it dispatches to.

The text decoder of a loaded model runs through `corelens_attention` (registered as "corelens" in
`AttentionInterface`, with `sdpa_mask` registered under the same name in `AttentionMaskInterface`, so the
model always builds a causal/padding mask for it). With no hook active for a module the call is exactly
transformers' sdpa path. Hooks are scoped to a set of attention modules (one model) and activated with
context managers; they see post-RoPE queries and keys and un-repeated GQA keys/values.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "corelens"

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


@dataclass
class AttentionCall:
    """One call of the attention function: what the model passed, plus the decoder layer index."""

    module: torch.nn.Module
    layer: int
    query: torch.Tensor  # (batch, heads, q_len, head_dim), post-RoPE
    key: torch.Tensor  # (batch, kv_heads, kv_len, head_dim), post-RoPE, not repeated
    value: torch.Tensor  # (batch, kv_heads, kv_len, head_dim)
    attention_mask: torch.Tensor | None  # None means plain causal
    scaling: float
    kwargs: dict = field(default_factory=dict)
    kernel: Kernel | None = None  # a hook may replace the attention kernel (hybrid, SAP, knockout)

    @property
    def groups(self) -> int:
        """Return the number of query heads per key/value head."""
        return self.query.shape[1] // self.key.shape[1]

    @property
    def q_offset(self) -> int:
        """Return the absolute position of the first query row (non-zero when decoding with a cache)."""
        return self.key.shape[2] - self.query.shape[2]


class AttentionHook:
    """Base class of probes and interventions; override `pre` and/or `post`."""

    def pre(self, call: AttentionCall) -> None:
        """Inspect or change the call before the kernel runs (may set `call.kernel`)."""

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Inspect or change the kernel output, shaped (batch, q_len, heads, head_dim)."""
        return output


_lock = threading.Lock()
# id(attention module) -> (layer index, hooks active on it, outermost first)
_active: dict[int, tuple[int, list[AttentionHook]]] = {}


def corelens_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention as transformers' sdpa computes it, with the active corelens hooks applied.

    The parameters come in `sdpa_attention_forward`'s order, so a wrapper that passes `dropout` by position
    (kvpress's head-wise key masking does) calls it correctly.
    """
    entry = _active.get(id(module))
    if entry is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    layer, hooks = entry
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    call = AttentionCall(module, layer, query, key, value, attention_mask, scaling, dict(kwargs))
    for hook in hooks:
        hook.pre(call)
    kernel = call.kernel or sdpa_attention_forward
    output, weights = kernel(
        module,
        call.query,
        call.key,
        call.value,
        call.attention_mask,
        scaling=call.scaling,
        dropout=dropout,
        **call.kwargs,
    )
    for hook in hooks:
        output = hook.post(call, output)
    return output, weights


def register() -> None:
    """Register the corelens attention function and its mask twin with transformers (idempotent)."""
    AttentionInterface.register(NAME, corelens_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def activate(layers: Iterable[tuple[int, torch.nn.Module]], hook: AttentionHook) -> Iterator[AttentionHook]:
    """Activate `hook` on the given (layer index, attention module) pairs for the duration of the block.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> m = cl.load(organism_path(), device="cpu")
        >>> class Shapes(AttentionHook):
        ...     def __init__(self):
        ...         self.seen = []
        ...
        ...     def pre(self, call):
        ...         self.seen.append((call.layer, tuple(call.query.shape), tuple(call.key.shape)))
        >>> with torch.no_grad(), activate(m.layer_modules()[:2], Shapes()) as hook:  # layers 0 and 1
        ...     _ = m.model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]))
        >>> hook.seen  # (batch, heads, positions, head_dim): 8 query heads over 2 KV heads
        [(0, (1, 8, 5, 16), (1, 2, 5, 16)), (1, (1, 8, 5, 16), (1, 2, 5, 16))]
        >>> _ = m.model(input_ids=torch.tensor([[1, 2]]))  # outside the block: not called
        >>> len(hook.seen)
        2
    """
    pairs = list(layers)
    with _lock:
        for layer, module in pairs:
            _active.setdefault(id(module), (layer, []))[1].append(hook)
    try:
        yield hook
    finally:
        with _lock:
            for _, module in pairs:
                entry = _active.get(id(module))
                if entry is None:
                    continue
                entry[1][:] = [h for h in entry[1] if h is not hook]
                if not entry[1]:
                    del _active[id(module)]


def active_hooks(module: torch.nn.Module) -> list[AttentionHook]:
    """Return the hooks active on an attention module (empty when none)."""
    entry = _active.get(id(module))
    return list(entry[1]) if entry else []


register()
