"""`graded`: every KV head keeps a budget of the prompt's keys in proportion to its score (SparseMM's rule).

docs/methods.md#graded-budgets. The total budget is `budget` x (KV heads x prompt length) keys; every KV head
gets an equal floor (`floor` of the mean per-head budget), the rest is shared in proportion to the heads'
scores (query-head scores summed per KV group, as SparseMM does for GQA), each head's budget capped at the
prompt and what the cap leaves over shared by score among the other heads (`allocate`). Within a head, `select`
chooses which prompt keys stay: "sink+window" (the first `sink` keys and the most recent ones up to the head's
budget) or "top" (the keys that the last `rows` prompt rows, the
observation window, attend to most, summed over the group's query heads and the rows, plus those `rows`
keys themselves, as SnapKV / SparseMM). The kept keys are chosen at the prefill; from the observation rows on
(the question, then every decoding step) a head reads only its kept prompt keys and the generated ones, the
earlier prompt rows attend causally in full: the cache is compressed once the prompt is read, before the
question is answered. It runs on the dense masked path (fp32; small prompts), inside the one attention function.
`report` states the share of the prompt's KV cache kept and its bytes, as hybrid's tables do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from corelens.attention.dispatch import AttentionCall, AttentionHook, Kernel
from corelens.attention.kernels.dense import masked_attention
from corelens.attention.kernels.masks import allowed_mask
from corelens.attention.streaming import DEFAULT_SINK
from corelens.choices import GRADED_SELECTS
from corelens.errors import CorelensError, OptionError
from corelens.policies.core import Applied, Policy, model_shape, register

SELECTS = GRADED_SELECTS


def allocate(scores: torch.Tensor, budget: float, floor: float, n: int) -> torch.Tensor:
    """Return each KV head's key budget for an `n`-key prompt: an equal floor, the rest by score, at most `n`.

    What a head's cap at the prompt leaves over goes to the heads below it, by score (equally when their
    scores are all 0), so that the heads together keep `budget` of the cache (up to rounding and the one key
    every head keeps): the frontier compares a graded cell with a binary one at the same share.

    Examples:
        >>> allocate(torch.tensor([[3.0, 1.0], [0.0, 0.0]]), budget=0.5, floor=0.2, n=10)
        tensor([[10,  8],
                [ 1,  1]])
    """
    units = scores.numel()
    total = budget * units * n
    each = floor * total / units
    weights = scores.double().clamp(min=0)
    share = weights / weights.sum() if weights.sum() > 0 else torch.full_like(weights, 1 / units)
    keys = each + (total - each * units) * share
    for _ in range(units):  # each round caps at least one more head, or none is over
        over = (keys - n).clamp(min=0).sum()
        if over <= 1e-9:
            break
        keys = keys.clamp(max=n)
        below = keys < n
        if not below.any():
            break
        w = torch.where(below, weights, torch.zeros_like(weights))
        w = w if w.sum() > 0 else below.double()
        keys = keys + over * w / w.sum()
    return keys.round().long().clamp(min=1, max=n)


def kv_scores(scores, layers: int, heads: int, kv_heads: int, granularity: str = "query") -> torch.Tensor:
    """Return (layers, kv_heads) scores from (layer, head, score) rows of query heads (summed per KV group)
    or of KV heads (`granularity` "kv"); a head without a row scores 0."""
    per = kv_heads if granularity == "kv" else heads
    table = torch.zeros(layers, per, dtype=torch.float64)
    for layer, head, value in scores:
        if layer >= layers or head >= per:
            raise CorelensError(f"graded budget: head L{layer}H{head} is outside a model of {layers} x {per}")
        table[layer, head] = value
    return table if per == kv_heads else table.view(layers, kv_heads, heads // kv_heads).sum(dim=-1)


class GradedHook(AttentionHook):
    """Masks every KV head's dropped prompt keys for the observation rows and the decoding steps."""

    kind = "pattern"
    name = "graded budget"

    def __init__(self, policy: GradedBudget, scores: torch.Tensor, key_bytes: int) -> None:
        self.policy = policy
        self.scores = scores  # (layers, kv_heads)
        self.key_bytes = key_bytes  # bytes of one key + value of one KV head at one position
        self.kept: dict[int, torch.Tensor] = {}  # layer -> (kv_heads, n) kept prompt keys of the last prefill
        self.budgets: torch.Tensor | None = None

    def choose(self, call: AttentionCall) -> torch.Tensor:
        """Return (kv_heads, n) booleans: the prompt keys each KV head keeps (module docstring)."""
        p = self.policy
        batch, _, n, _ = call.query.shape
        if batch != 1:
            raise CorelensError("graded budgets choose keys per prompt: run one prompt at a time")
        if call.layer == 0 or self.budgets is None:
            self.budgets = allocate(self.scores, p.budget, p.floor, n)
        budgets = self.budgets[call.layer].tolist()
        kept = torch.zeros(len(budgets), n, dtype=torch.bool)
        obs = min(p.rows, n)
        if p.select == "top":
            q = call.query[0, :, n - obs :].float()  # (heads, obs, dim)
            logits = torch.einsum("hrd,hnd->hrn", q, call.key[0].float().repeat_interleave(call.groups, 0))
            causal = torch.arange(n)[None, :] <= torch.arange(n - obs, n)[:, None]
            probs = torch.softmax(
                logits.mul(call.scaling).masked_fill(~causal.to(q.device), float("-inf")), -1
            )
            votes = probs.sum(dim=1).view(len(budgets), call.groups, n).sum(dim=1).cpu()  # (kv_heads, n)
        for h, b in enumerate(budgets):
            if p.select == "sink+window":
                sink = min(p.sink, b)
                kept[h, :sink] = True
                if b > sink:
                    kept[h, n - (b - sink) :] = True
            else:
                kept[h, n - min(obs, b) :] = True
                extra = b - min(obs, b)
                if extra > 0:
                    kept[h, votes[h, : n - obs].topk(min(extra, n - obs)).indices] = True
        return kept

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """At the prefill choose the kept keys; every call then runs the dense masked path."""
        q_len, k_len = call.query.shape[2], call.key.shape[2]
        if q_len == k_len:
            self.kept[call.layer] = self.choose(call)
        kept = self.kept.get(call.layer)
        if kept is None:
            raise CorelensError("graded budget: a decoding step came before its prompt's prefill")
        n = kept.shape[1]
        device = call.query.device
        q_pos = torch.arange(k_len - q_len, k_len, device=device)
        k_pos = torch.arange(k_len, device=device)
        keys = torch.ones(kept.shape[0], k_len, dtype=torch.bool, device=device)
        keys[:, :n] = kept.to(device)
        reads = (q_pos >= n - min(self.policy.rows, n))[:, None]  # observation and decoding rows
        allowed = (k_pos[None, :] <= q_pos[:, None]) & (
            ~reads | keys.repeat_interleave(call.groups, 0)[:, None]
        )
        model = allowed_mask(call.attention_mask)
        if model is not None:
            allowed = allowed & model
        return lambda module, query, key, value, mask, scaling=None, **kw: (
            masked_attention(query, key, value, allowed, scaling),
            None,
        )


@register
@dataclass(frozen=True)
class GradedBudget(Policy):
    """Per-KV-head key budgets in proportion to `scores` ((layer, head, score) rows), `budget` of the cache kept."""

    name: ClassVar[str] = "graded"
    scores: tuple[tuple[int, int, float], ...] = ()
    budget: float = 0.2  # the share of the prompt's KV cache kept, all heads together
    floor: float = (
        0.2  # the share of the mean per-head budget every head gets before the scores share the rest
    )
    select: str = "sink+window"  # or "top"
    sink: int = DEFAULT_SINK  # "sink+window": the first keys every head keeps
    rows: int = (
        16  # the observation window: the last prompt rows (they read the kept keys; "top" votes with them)
    )
    granularity: str = "query"  # what `scores` rows name: query heads (summed per KV group) or "kv" heads

    def __post_init__(self) -> None:
        object.__setattr__(self, "scores", tuple((int(a), int(b), float(c)) for a, b, c in self.scores))
        if self.select not in SELECTS:
            raise OptionError(f"graded budget: unknown select {self.select!r}; expected one of {SELECTS}")
        if not 0 < self.budget <= 1 or not 0 <= self.floor <= 1:
            raise OptionError(
                f"graded budget: budget in (0, 1] and floor in [0, 1], got {self.budget}, {self.floor}"
            )
        if self.granularity not in ("query", "kv"):
            raise OptionError(f"graded budget: granularity 'query' or 'kv', got {self.granularity!r}")
        if self.rows < 1 or self.sink < 0:
            raise OptionError(f"graded budget: rows >= 1 and sink >= 0, got {self.rows}, {self.sink}")

    def hooks(self, model: Any, context) -> list[GradedHook]:
        """Return the one hook on every layer, with the scores summed per KV group."""
        layers, heads = model_shape(model)
        hf = model.model if hasattr(model, "layer_modules") else model  # a `Loaded` model or a bare one
        config = hf.config.get_text_config()
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        dtype = next(hf.parameters()).dtype
        key_bytes = 2 * dim * torch.finfo(dtype).bits // 8
        return [
            GradedHook(self, kv_scores(self.scores, layers, heads, kv_heads, self.granularity), key_bytes)
        ]

    def report(self, applied: Applied) -> dict:
        """Return the share of the last prompt's KV cache kept and the bytes kept / a full cache holds."""
        hook = applied.hooks[0]
        if not hook.kept:
            return {}
        kept = sum(int(k.sum()) for k in hook.kept.values())
        total = sum(k.numel() for k in hook.kept.values())
        return {
            "cache_kept_fraction": kept / total,
            "kv_bytes_kept": kept * hook.key_bytes,
            "kv_bytes_full": total * hook.key_bytes,
        }
