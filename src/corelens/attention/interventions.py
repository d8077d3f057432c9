"""What the head operators of `corelens.policies` (docs/methods.md#interventions) share with the rest of the
attention layer: the knockout reference kernel, the reference statistics of `mean` (`HeadMeans`) and the hook
that records them (`MeanRecorder`).

The operators themselves are policies, one file each: `corelens.policies.zero`, `.mean`, `.uniform`,
`.knockout`. Positions and roles reach hooks through the call's context (`corelens.attention.prompt_context`), taken
from `prepare(...)`'s layout (the same sets RAM uses): positions at or after the prompt (generated tokens) are
text. Absolute key positions assume a cache that keeps every key (DynamicCache).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corelens.attention.dispatch import AttentionCall, AttentionHook, Kernel, activate
from corelens.attention.prompt_context import needs
from corelens.choices import KEY_SETS, OPS

__all__ = ["KEY_SETS", "OPS", "HeadMeans", "MeanRecorder", "knockout_attention", "knockout_kernel"]

# Bound on the (batch, heads, rows, keys) mask / score block the knockout reference materialises at once.
_CHUNK_ELEMENTS = 1 << 24


@dataclass
class HeadMeans:
    """Mean output of every (layer, query head) over a reference set, per role: (layers, heads, head_dim)."""

    text: np.ndarray
    visual: np.ndarray
    n_text: int  # positions averaged (per layer and head)
    n_visual: int
    meta: dict = field(default_factory=dict)  # where the statistics come from (file, sha256, sample ids)

    def save(self, path: str | Path) -> Path:
        """Write the statistics to an `.npz` file (arrays + JSON metadata); return the path."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            text=self.text,
            visual=self.visual,
            n_text=self.n_text,
            n_visual=self.n_visual,
            meta=json.dumps(self.meta, sort_keys=True),
        )
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> HeadMeans:
        """Read statistics written by `save`."""
        with np.load(path) as f:
            return cls(
                f["text"], f["visual"], int(f["n_text"]), int(f["n_visual"]), json.loads(str(f["meta"]))
            )


def knockout_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    blocked: torch.Tensor,
    q_offset: int,
) -> torch.Tensor:
    """Return attention (batch, heads, q_len, dim) of query heads whose KV heads are given, keys `blocked` masked.

    `key` / `value` are already one KV head per query head; `blocked` is (batch, kv_len) bool. The causal or
    padding mask of the call applies as the model passes it (None = causal, bottom-right aligned). Rows are
    processed in chunks so the dense mask never exceeds `_CHUNK_ELEMENTS`.
    """
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    out = torch.empty(batch, heads, q_len, value.shape[-1], dtype=query.dtype, device=query.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * kv_len))
    keys = torch.arange(kv_len, device=query.device)
    free = ~blocked[:, None, None, :].to(query.device)
    # fp32 scores and softmax whatever the model's dtype: sdpa's math fallback would run them in bf16.
    key32, value32 = key.float(), value.float()
    for s in range(0, q_len, step):
        e = min(q_len, s + step)
        if attention_mask is None:
            rows = torch.arange(s, e, device=query.device) + q_offset
            allowed = (keys[None, :] <= rows[:, None])[None, None] & free
        else:
            block = attention_mask[:, :, s:e, :kv_len]
            if block.dtype == torch.bool:
                allowed = block & free
            else:
                allowed = (block > torch.finfo(block.dtype).min / 2) & free
        allowed = allowed.expand(batch, heads, e - s, kv_len)
        alive = allowed.any(dim=-1, keepdim=True)
        # A row with no key left would be NaN: let it see key 0, then zero its output.
        safe = allowed | (~alive & (keys == 0))
        part = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, s:e].float(), key32, value32, attn_mask=safe, scale=scaling
        ).to(query.dtype)
        out[:, :, s:e] = torch.where(alive, part, torch.zeros((), dtype=part.dtype, device=part.device))
    return out


def knockout_kernel(inner: Kernel, heads: torch.Tensor, blocked: torch.Tensor, q_offset: int) -> Kernel:
    """Return a kernel that runs `inner` for all heads, then recomputes `heads` with `blocked` keys masked."""

    def kernel(module, query, key, value, attention_mask, *, scaling, dropout=0.0, **kwargs):
        output, weights = inner(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
        groups = query.shape[1] // key.shape[1]
        idx = heads.to(query.device)
        kv_idx = idx // groups
        part = knockout_attention(
            query[:, idx], key[:, kv_idx], value[:, kv_idx], attention_mask, scaling, blocked, q_offset
        )
        output = output.index_copy(2, idx, part.transpose(1, 2).to(output.dtype))
        return output, weights

    return kernel


class MeanRecorder(AttentionHook):
    """Accumulates each (layer, query head)'s output over positions, split by role (visual / text), in fp64."""

    name = "mean recorder"

    def __init__(self, m: Any) -> None:
        shape = (
            m.num_layers,
            m.num_heads,
            m.text_config.head_dim or m.text_config.hidden_size // m.num_heads,
        )
        self.text = torch.zeros(shape, dtype=torch.float64)
        self.visual = torch.zeros(shape, dtype=torch.float64)
        self.n_text = 0
        self.n_visual = 0
        self._modules = m.layer_modules()

    @contextmanager
    def installed(self) -> Iterator[MeanRecorder]:
        """Activate the recorder on every decoder layer (run each prompt inside its `attention_context`)."""
        with activate(self._modules, self):
            yield self

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Add this call's outputs to the per-role sums (roles from the call's context)."""
        start = call.q_offset
        context = needs(call.context, self.name)
        is_visual = context.visual_mask(start, start + output.shape[1], output.shape[0], output.device)
        out = output.detach().double()
        self.visual[call.layer] += out[is_visual].sum(dim=0).cpu()
        self.text[call.layer] += out[~is_visual].sum(dim=0).cpu()
        if call.layer == 0:
            self.n_visual += int(is_visual.sum())
            self.n_text += int((~is_visual).sum())
        return output

    def result(self, meta: dict | None = None) -> HeadMeans:
        """Return the means (NaN for a role never seen)."""
        nan = float("nan")
        text = (self.text / self.n_text).numpy() if self.n_text else np.full(self.text.shape, nan)
        visual = (self.visual / self.n_visual).numpy() if self.n_visual else np.full(self.visual.shape, nan)
        return HeadMeans(text, visual, self.n_text, self.n_visual, dict(meta or {}))
