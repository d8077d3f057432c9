"""The names policies replace, kept for one release: each warns (DeprecationWarning) and does what it did.

- `Ablation(heads, op, keys, ...)` -> one of `ZeroHeads`, `MeanHeads`, `UniformHeads`, `KnockoutHeads`
  (`Ablation.policy()` converts); its JSON (`to_json`: heads + op) still loads;
- `ablate(m, heads, op, ...)` -> `with policy.applied(m, prepared): ...`;
- `hybrid(m, full, ...)` -> `HybridAttention` / `AdaptiveHybrid` (`policy.applied(m, prepared)`).

Without a prepared prompt, `ablate` and `hybrid(full="adaptive")` take the visual positions from the token ids
of each prefill, as they did (`ids_context`); `ab.for_sample(sample, prepared)` / `ab.positions(...)` set
them from the prepared prompt instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.attention.streaming import DEFAULT_SINK, DEFAULT_WINDOW, HybridPlan, as_plan
from corelens.choices import KEY_SETS, OPS
from corelens.deprecation import deprecated
from corelens.errors import CorelensError, OptionError
from corelens.policies.adaptive_hybrid import AdaptiveHybrid
from corelens.policies.core import POLICIES, Policy, context_of, layer_modules
from corelens.policies.hybrid_attention import HybridAttention


@dataclass(frozen=True)
class Ablation:
    """Deprecated: an ablation as plain data; use `ZeroHeads` / `MeanHeads` / `UniformHeads` / `KnockoutHeads`."""

    heads: tuple[tuple[int, int], ...]
    op: str = "zero"
    keys: str = "visual"
    label: str = ""
    seed: int | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        deprecated(
            "corelens.Ablation", "corelens.policies.ZeroHeads / MeanHeads / UniformHeads / KnockoutHeads"
        )
        object.__setattr__(self, "heads", tuple(sorted({(int(lh[0]), int(lh[1])) for lh in self.heads})))
        if self.op not in OPS:
            raise OptionError(f"unknown ablation op {self.op!r}; expected one of {OPS}")
        if self.keys not in KEY_SETS:
            raise OptionError(f"unknown knockout key set {self.keys!r}; expected one of {KEY_SETS}")

    def policy(self, means: Any = None) -> Policy:
        """Return the policy this ablation is."""
        extra = (
            {"keys": self.keys} if self.op == "knockout" else {"means": means} if self.op == "mean" else {}
        )
        return POLICIES[self.op](self.heads, self.label, self.seed, dict(self.meta), **extra)

    def to_dict(self) -> dict:
        """Return the ablation as a JSON-ready dict."""
        return {**asdict(self), "heads": [list(h) for h in self.heads]}

    def to_json(self) -> str:
        """Return the ablation as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> Ablation:
        """Return the ablation of a `to_dict` dict."""
        return cls(**{**data, "heads": tuple(tuple(h) for h in data["heads"])})

    @classmethod
    def from_json(cls, text: str) -> Ablation:
        """Return the ablation of a `to_json` string."""
        return cls.from_dict(json.loads(text))


def ablation_policy(data: dict, means: Any = None) -> Policy:
    """Return the policy of an ablation's dict (`Ablation.to_dict`: heads + op), without a warning."""
    extra = {"keys": data.get("keys", "visual")} if data["op"] == "knockout" else {}
    if data["op"] == "mean":
        extra["means"] = means
    heads = tuple(tuple(h) for h in data["heads"])
    return POLICIES[data["op"]](
        heads, data.get("label", ""), data.get("seed"), dict(data.get("meta", {})), **extra
    )


def _past_length(kwargs: dict) -> int:
    for name in ("past_key_values", "cache"):
        cache = kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length())
    return 0


@contextmanager
def ids_context(m: Any) -> Iterator[AttentionContext]:
    """Inside the block, each prefill's visual positions come from its token ids (image / video tokens)."""
    model = m.model if hasattr(m, "layer_modules") else m
    config = model.config
    ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
    tokens = torch.tensor([i for i in ids if i is not None], dtype=torch.long)
    context = AttentionContext()

    def on_forward(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if _past_length(kwargs):
            return  # a decoding step: generated tokens are text, the prefill's positions hold
        given = kwargs.get("input_ids", args[0] if args else None)
        if not isinstance(given, torch.Tensor) or given.dim() != 2:
            raise CorelensError(
                "this policy needs the visual positions, but the forward carried no token ids (inputs_embeds?): "
                "apply it with the prepared prompt (`policy.applied(m, prepared)`)"
            )
        context.visual = torch.isin(given[0].cpu(), tokens).nonzero().flatten()

    handle = model.register_forward_pre_hook(on_forward, with_kwargs=True)
    try:
        with attention_context(context):
            yield context
    finally:
        handle.remove()


class Ablator:
    """What the deprecated `ablate` yields: the policy, its hooks, and position overrides for a block."""

    def __init__(self, policy: Policy, hooks: list) -> None:
        self.policy, self.hooks = policy, hooks

    @contextmanager
    def positions(self, *, visual: Any = None, omega: Any = None) -> Iterator[Ablator]:
        """Use these absolute visual / Omega positions for the forwards in the block."""
        if visual is None and omega is None:
            yield self
            return
        with attention_context(AttentionContext(() if visual is None else visual, omega=omega)):
            yield self

    @contextmanager
    def for_sample(self, sample: Any, prepared: Any, rule: str = "any") -> Iterator[Ablator]:
        """Use the positions of a prepared sample (Omega from its targets) for the forwards in the block."""
        with attention_context(context_of(prepared, sample, rule)):
            yield self


@contextmanager
def ablate(
    m: Any,
    heads: Ablation | Iterable[tuple[int, int]],
    op: str = "zero",
    *,
    keys: str = "visual",
    means: Any = None,
) -> Iterator[Ablator]:
    """Deprecated: `with policy.applied(m, prepared)` of a `ZeroHeads` / ... policy."""
    deprecated(
        "corelens.ablate", "`with corelens.policies.ZeroHeads(heads).applied(m, prepared)` (or MeanHeads...)"
    )
    if isinstance(heads, Ablation):
        op, keys, pairs = heads.op, heads.keys, heads.heads
    else:
        pairs = tuple(tuple(h) for h in heads)
    if op not in OPS:
        raise OptionError(f"unknown ablation op {op!r}; expected one of {OPS}")
    policy = ablation_policy({"heads": pairs, "op": op, "keys": keys}, means)
    positions = ids_context(m) if op in ("mean", "knockout") else attention_context(None)
    with positions, policy.applied(m) as on:
        yield Ablator(policy, on.hooks)


@contextmanager
def hybrid(
    m: Any,
    full: Any = (),
    *,
    sink: int | None = None,
    window: int | None = None,
    keep: Any = None,
    kernel: str = "auto",
    decode: str = "full",
    budget: float | None = None,
    prior: Any = None,
    signal: Any = None,
    rows: int = 16,
    dense_below: Any = "default",
) -> Iterator[Any]:
    """Deprecated: `with HybridAttention(...).applied(m, prepared)` (or `AdaptiveHybrid`); yields the session."""
    deprecated(
        "corelens.hybrid", "`with corelens.policies.HybridAttention(full, sink, window).applied(m, prepared)`"
    )
    if not (isinstance(full, str) and full == "adaptive"):
        options = {} if dense_below == "default" else {"dense_below": dense_below}
        if isinstance(full, (str, Path)) and str(full).endswith(".json"):  # a hybrid policy file
            read = Policy.from_file(full)
            if not isinstance(read, HybridAttention):
                raise CorelensError(f"{full}: not a hybrid policy (it holds {read.name!r})")
            full = read.plan()
        plan = as_plan(full, sink=sink, window=window, keep=keep)
        with HybridAttention.of(plan, kernel=kernel, decode=decode, **options).applied(m) as on:
            yield on.hooks[0].session
        return
    if budget is None:
        raise CorelensError("full='adaptive' needs a budget: the share of heads kept full, in (0, 1]")
    if decode != "full":
        raise CorelensError("adaptive hybrid attention decodes with full attention (decode='full')")
    if not 0.0 < budget <= 1.0:
        raise CorelensError(f"the adaptive budget must be in (0, 1], got {budget}")
    fixed = None
    if prior is not None:
        table = prior.heads if hasattr(prior, "heads") else prior
        fixed = (prior if isinstance(prior, HybridPlan) else HybridPlan.from_heads(table, budget)).full
    policy = AdaptiveHybrid(
        budget, fixed, DEFAULT_SINK if sink is None else sink, DEFAULT_WINDOW if window is None else window,
        rows, kernel, signal,
    )  # fmt: skip
    with ids_context(m), policy.applied(m) as on:
        yield on.hooks[0].session


__all__ = ["Ablation", "Ablator", "ablate", "ablation_policy", "hybrid", "ids_context", "layer_modules"]
