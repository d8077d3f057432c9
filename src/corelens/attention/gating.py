"""DuoAttention's gated attention: each head's output is a learnable mix of full and streaming attention.

docs/methods.md#gates. `GateHook` is a "pattern" hook (`attention.dispatch`) on every decoder layer. With
gates alpha (layers, query heads) in [0, 1] each head's output becomes

    alpha_h * full_h + (1 - alpha_h) * streaming_h

where `full_h` is the inner kernel's output (the stock sdpa call: causal attention) and `streaming_h` the same
head under the streaming rule of hybrid attention (`kernels.masks.streaming_mask_function`: S sinks + a window
of W recent keys, the rule every hybrid kernel runs). At alpha = 1 the model is the dense one, at alpha = 0 /
1 per head it is hybrid attention with the heads at 1 kept full. The mix is differentiable in alpha and in
everything upstream, so `experiments.gates` trains alpha with the model's weights frozen. A prompt no longer
than S + W streams nothing (the rule keeps every pair), so the streaming pass is skipped.

The gates are held in fp32 whatever the model's dtype; the mix is computed in fp32 (fp64 for a float64
model) and cast back. The streaming
pass materialises its (batch, 1, q, k) boolean mask: gates train on prompts of training length, not on the
longest a kernel serves. One gate row per batch copy (`alpha` of shape (batch, layers, heads)) evaluates a
different gate setting per copy in one forward.

Examples:
    >>> import corelens as cl
    >>> from corelens.organism import organism_path
    >>> m = cl.load(organism_path(), device="cpu")
    >>> ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    >>> dense = m.model(input_ids=ids).logits
    >>> with torch.no_grad(), gated(m, torch.ones(4, 8), sink=1, window=2):  # every gate at 1: dense
    ...     torch.allclose(m.model(input_ids=ids).logits, dense, atol=1e-5)
    True
    >>> with torch.no_grad(), gated(m, torch.zeros(4, 8), sink=1, window=2):  # every head streams
    ...     torch.allclose(m.model(input_ids=ids).logits, dense, atol=1e-5)
    False
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from corelens.attention.dispatch import AttentionCall, AttentionHook, Kernel, activate
from corelens.attention.kernels.dense import last_rows_allowed
from corelens.attention.kernels.masks import Pattern
from corelens.errors import OptionError


def streaming_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    pattern: Pattern,
    scaling: float,
) -> torch.Tensor:
    """Return every head's attention (batch, q, heads, dim) under the streaming rule, differentiably.

    The mask is the hybrid rule with no full head (`kernels.dense.last_rows_allowed`), AND the model's mask;
    queries are the last q key positions (a prefill). GQA keys are repeated for sdpa.
    """
    no_full = torch.zeros(1, dtype=torch.bool, device=query.device)
    allowed = last_rows_allowed(query, key, attention_mask, no_full, pattern)  # (batch, 1, q, k)
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1)
    v = value.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2)


class GateHook(AttentionHook):
    """Mixes full and streaming attention per head by the gates `alpha` (module docstring)."""

    kind = "pattern"
    name = "gated attention"

    def __init__(self, alpha: torch.Tensor, pattern: Pattern) -> None:
        if alpha.dim() not in (2, 3):
            raise OptionError(
                f"gates must be (layers, heads) or (batch, layers, heads), got {tuple(alpha.shape)}"
            )
        self.alpha = alpha
        self.pattern = pattern

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """Return the kernel that runs `inner` (full) and the streaming pass, mixed by this layer's gates."""
        if call.query.shape[2] != call.key.shape[2]:
            raise OptionError("gated attention runs whole prompts (use_cache=False), not decoding steps")
        if self.pattern.is_dense(call.key.shape[2]):
            return inner  # every pair is kept: streaming equals full whatever the gate
        return partial(self._mixed, inner, call.layer)

    def _mixed(self, inner, layer, module, query, key, value, attention_mask, scaling=None, **kwargs):
        full, _ = inner(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        stream = streaming_attention(query, key, value, attention_mask, self.pattern, scaling)
        dtype = torch.promote_types(full.dtype, torch.float32)  # fp32, or fp64 for a float64 model
        a = self.alpha[..., layer, :].to(full.device, dtype)  # (heads,) or (batch, heads)
        a = a[None, None, :, None] if a.dim() == 1 else a[:, None, :, None]
        mixed = a * full.to(dtype) + (1 - a) * stream.to(dtype)
        return mixed.to(full.dtype), None


def layer_modules(m: Any) -> list:
    """Return the (layer, attention module) pairs of a `Loaded` model or a bare transformers model."""
    if hasattr(m, "layer_modules"):
        return m.layer_modules()
    from corelens.attention.modules import decoder_attention_modules

    return list(enumerate(decoder_attention_modules(m)))


@contextmanager
def gated(m: Any, alpha: torch.Tensor, *, sink: int, window: int) -> Iterator[GateHook]:
    """Run `m` with gated attention inside the block: gates `alpha` (layers, heads), streaming budget S, W."""
    hook = GateHook(alpha, Pattern(sink, window))
    with activate(layer_modules(m), hook):
        yield hook
