"""Input-adaptive hybrid attention (docs/methods.md#adaptive-hybrid): the full heads chosen per prompt.

`AdaptiveHybrid(budget=F, full=<the fixed set>)` (`corelens.policies`) keeps, in each layer l, as many full heads as the
fixed CoRe policy at the same budget keeps there (`quota_l`; `prior` may also be that fixed set's `HybridPlan`;
without `prior`, round(F x H) per layer). Which
ones is decided during the prefill itself, layer by layer, just before the layer's attention runs: the
signal of head h is the attention mass that the last `rows` prompt positions (the question and the
generation prompt) put on the visual tokens, computed from the layer's post-RoPE queries and keys for those
rows only (rows x N logits per head, not N x N). The `quota_l` heads with the largest signal are full.
A given `signal` (a layers x heads table) replaces the measured one: with the prior's own mass it chooses
exactly the fixed policy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from corelens.attention.dispatch import AttentionCall, Kernel
from corelens.attention.probes import row_probabilities
from corelens.attention.prompt_context import needs
from corelens.attention.streaming import Hybrid, HybridHook, HybridPlan
from corelens.errors import CorelensError


def quotas(layers: int, heads: int, budget: float, prior: Any = None) -> torch.Tensor:
    """Return the full heads per layer: the fixed top-`budget` policy's count per layer, or round(budget x H)."""
    if not 0.0 < budget <= 1.0:
        raise CorelensError(f"the adaptive budget must be in (0, 1], got {budget}")
    if prior is None:
        return torch.full((layers,), round(budget * heads), dtype=torch.long)
    if isinstance(prior, HybridPlan):  # a fixed policy: its own count in each layer
        return prior.full_mask(layers, heads).sum(dim=1)
    table = prior.heads if hasattr(prior, "heads") else prior
    full = HybridPlan.from_heads(table, budget).full_mask(layers, heads)
    return full.sum(dim=1)


class AdaptiveHook(HybridHook):
    """The hybrid hook, with each layer's full heads chosen from the prompt just before its prefill."""

    def __init__(self, session: Hybrid, quota: torch.Tensor, rows: int, signal: torch.Tensor | None):
        super().__init__(session)
        self.quota, self.rows, self.signal = quota, rows, signal
        self.chosen: list[torch.Tensor] = []  # per prefill, the (layers, heads) full table it chose
        self.signals: dict[int, dict[int, torch.Tensor]] = {}  # per prefill and layer, the measured signal

    def measure(self, call: AttentionCall) -> torch.Tensor:
        """Return (heads,) mean attention mass of the last `rows` prompt rows on the visual tokens."""
        batch, _, n, _ = call.query.shape
        if batch != 1:
            raise CorelensError(
                "adaptive hybrid attention chooses heads per prompt: run one prompt at a time"
            )
        visual = needs(call.context, "adaptive hybrid attention").visual_mask(0, n, 1, call.query.device)[0]
        rows = torch.arange(max(n - self.rows, 0), n)
        probs = row_probabilities(call, rows)[0]  # (heads, rows, n): the RAM probe's rows, no N x N
        return probs[..., visual.to(probs.device)].sum(dim=-1).mean(dim=-1)

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """At a prefill call, choose this layer's full heads; then choose the hybrid kernel."""
        s = self.session
        q_len, kv_len = call.query.shape[2], call.key.shape[2]
        if q_len == kv_len:
            quota = int(self.quota[call.layer])
            if quota in (0, s.heads):
                scores = None  # nothing to choose: no full head, or every head full
            elif self.signal is not None:
                scores = self.signal[call.layer]
            else:
                scores = self.measure(call).cpu()
                s.stats["signal"] += 1
                self.signals.setdefault(len(self.chosen) - (call.layer > 0), {})[call.layer] = scores
            row = torch.zeros(s.heads, dtype=torch.bool)
            if scores is None:
                row[:] = quota == s.heads
            else:
                order = np.argsort(-scores.double().numpy(), kind="stable")  # ties: the lower head index
                row[torch.from_numpy(order[:quota].copy())] = True
            s.full[call.layer] = row
            if call.layer == 0:
                self.chosen.append(s.full.clone())
            else:
                self.chosen[-1][call.layer] = row
        return super().attend(call, inner)


def adaptive_session(
    m: Any,
    budget: float,
    *,
    prior: Any = None,
    signal: Any = None,
    rows: int = 16,
    sink: int,
    window: int,
    kernel: str,
    decode: str,
) -> Hybrid:
    """Return a Hybrid session whose full heads are chosen per prompt (module docstring)."""
    if decode != "full":
        raise CorelensError("adaptive hybrid attention decodes with full attention (decode='full')")
    if rows < 1:
        raise CorelensError(f"the adaptive signal needs rows >= 1, got {rows}")
    session = Hybrid(m, HybridPlan((), sink, window, {"kind": "adaptive", "budget": budget}), kernel, decode)
    quota = quotas(session.layers, session.heads, budget, prior)
    table = None
    if signal is not None:
        if isinstance(signal, pd.DataFrame):
            signal = (
                signal.sort_values(["layer", "head"])["mass"]
                .to_numpy()
                .reshape(session.layers, session.heads)
            )
        table = torch.tensor(np.array(signal, dtype=np.float64))
        if table.shape != (session.layers, session.heads):
            raise CorelensError(
                f"the signal must be {session.layers} x {session.heads}, got {tuple(table.shape)}"
            )
    session.hook = AdaptiveHook(session, quota, rows, table)
    session.policy = HybridPlan(
        (), sink, window, {"kind": "adaptive", "budget": budget, "quota": quota.tolist()}
    )
    return session
