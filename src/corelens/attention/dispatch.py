"""The one attention function corelens registers with transformers, and the hooks it dispatches to.

The text decoder of a loaded model runs through `corelens_attention` (registered as "corelens" in
`AttentionInterface`, with `sdpa_mask` registered under the same name in `AttentionMaskInterface`, so the
model always builds a causal/padding mask for it). With no hook active for a module the call is exactly
transformers' sdpa path. Hooks are scoped to a set of attention modules (one model) and activated with
context managers; they see post-RoPE queries and keys and un-repeated GQA keys/values.

How hooks stack on one attention module is written here and nowhere else. The first hook activated is the
outermost. Each hook has a `kind`:

- "probe": reads the call or its output and changes nothing (RAM probe, key maps, mean recorder);
- "query": edits the queries before the kernel (uniform ablation);
- "output": edits the output after the kernel (zero and mean ablation);
- "pattern": changes which keys a head attends to, or with which weights (hybrid attention, knockout
  ablation, SAP).

A call runs in three steps. First every hook's `pre`, in the order of `ORDER`: query edits, then pattern
hooks, output edits, and probes last, so that probes read the queries every edit left. Then the kernel is
built by wrapping, like middleware: the stock sdpa call is the innermost kernel, and each hook's
`attend(call, inner)`, from the innermost hook out, returns the kernel that replaces `inner`, usually by
calling it. Wrapping is the only way to change the kernel. Last, every hook's `post` in the order of
`ORDER` again: a pattern hook's rewrite of whole rows (SAP) comes before an output edit (zero / mean
ablation), so an ablated head stays ablated whichever hook was activated first, and probes read the final
output. `activate` refuses the combinations that `refused` names, with the reason.
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

from corelens.attention.prompt_context import AttentionContext, current_context
from corelens.errors import CorelensError

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
    # What the prepared prompt knows (visual / Omega positions, query rows, prompt length); None outside
    # `attention_context` (corelens.attention.prompt_context).
    context: AttentionContext | None = None

    @property
    def groups(self) -> int:
        """Return the number of query heads per key/value head."""
        return self.query.shape[1] // self.key.shape[1]

    @property
    def q_offset(self) -> int:
        """Return the absolute position of the first query row (non-zero when decoding with a cache)."""
        return self.key.shape[2] - self.query.shape[2]


ORDER = ("query", "pattern", "output", "probe")  # the kinds, in the order of `pre` and of `post` in one call


class AttentionHook:
    """Base class of probes and interventions; override `pre`, `attend` and/or `post` (module docstring)."""

    kind: str = "probe"
    # "scores" for a probe that recomputes attention rows from the queries and keys with the stock causal
    # pattern (the RAM probe, key maps): it would misreport a head whose pattern another hook changes.
    reads: str = "output"
    # The decoder layers a policy activates the hook on (`corelens.policies`); None: every layer.
    layers: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        """Return the hook's name in error messages."""
        return type(self).__name__

    def pre(self, call: AttentionCall) -> None:
        """Inspect the call before the kernel runs; a "query" hook may replace `call.query`."""

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """Return the kernel of this call: `inner` itself, or a kernel that wraps (calls) it."""
        return inner

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Inspect or change the kernel output, shaped (batch, q_len, heads, head_dim)."""
        return output


def refused(outer: AttentionHook, inner: AttentionHook) -> str | None:
    """Return why `outer` and `inner` may not be active on one module together, or None when they may."""
    if outer.kind == inner.kind == "pattern":
        # Each would compute attention without the other's pattern: there is no order in which both hold.
        return "both change the attention pattern, and each computes attention without the other's"
    if "pattern" in {outer.kind, inner.kind} and "scores" in {outer.reads, inner.reads}:
        # The probe scores rows with the stock causal pattern, which the other hook no longer runs.
        return "the probe scores rows with the stock causal pattern, which the other hook changes"
    return REFUSED.get(frozenset({outer.name, inner.name}))


# Named refusals beyond the kind rules above, in either order: {hook name, other hook name} -> why.
REFUSED = {
    frozenset({"RoPE-free capture", "uniform ablation"}): (
        "the RoPE-free twin is computed from the queries before the ablation zeroes them"
    ),
}


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
    call = AttentionCall(
        module, layer, query, key, value, attention_mask, scaling, dict(kwargs), current_context()
    )
    # By kind, in the order of ORDER (stable within a kind: outer first); the module docstring says why.
    ordered = sorted(hooks, key=lambda h: ORDER.index(h.kind))
    for hook in ordered:
        hook.pre(call)
    kernel: Kernel = sdpa_attention_forward
    for hook in reversed(hooks):  # innermost first: the outer hook's kernel wraps the inner's
        kernel = hook.attend(call, kernel)
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
    for hook in ordered:
        output = hook.post(call, output)
    return output, weights


def register() -> None:
    """Register the corelens attention function and its mask twin with transformers (idempotent)."""
    AttentionInterface.register(NAME, corelens_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def activate(layers: Iterable[tuple[int, torch.nn.Module]], hook: AttentionHook) -> Iterator[AttentionHook]:
    """Activate `hook` on the given (layer index, attention module) pairs for the duration of the block.

    It becomes the innermost hook of each module. A combination that `refused` names is a CorelensError.

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
    if hook.kind not in ORDER:
        raise ValueError(f"{hook.name}: unknown hook kind {hook.kind!r}; expected one of {ORDER}")
    with _lock:
        for layer, module in pairs:
            for other in _active.get(id(module), (layer, []))[1]:
                reason = refused(other, hook)
                if reason:
                    raise CorelensError(
                        f"{hook.name} cannot run inside {other.name} (layer {layer}): {reason}"
                    )
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
