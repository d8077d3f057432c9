"""`hybrid`: a full set of heads keeps causal attention, every other head streams (S sinks + a W window).

docs/methods.md#hybrid. The kernels, the session and its trimmed cache are `corelens.attention.streaming`; this
policy is their plain data. `generate` passes the session's cache; `report` says what it saved and which
prefill kernels ran.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from corelens.attention import kernels
from corelens.attention.kernels import crossover
from corelens.attention.streaming import DEFAULT_SINK, DEFAULT_WINDOW, Hybrid, HybridPolicy
from corelens.policies.core import Applied, Policy, register


class SessionPolicy(Policy):
    """A policy whose one hook belongs to a `Hybrid` session: cache per `generate`, closed on leaving."""

    @abc.abstractmethod
    def session(self, model: Any) -> Hybrid:
        """Return a new session of this policy on `model`."""

    def hooks(self, model, context) -> list:
        """Return the session's hook (on every layer)."""
        return [self.session(model).hook]

    @contextmanager
    def applied(self, model, prepared=None, **kwargs) -> Iterator[Applied]:
        """Apply the policy; the session's trimmed cache cannot decode outside the block."""
        with super().applied(model, prepared, **kwargs) as on, on.hooks[0].session.running():
            yield on

    def generate_kwargs(self, applied: Applied) -> dict:
        """Return the session's cache for one `generate`."""
        return {"cache": applied.hooks[0].session.cache()}

    def report(self, applied: Applied) -> dict:
        """Return the cache bytes saved, the layer prefills per kernel that ran (``dense``: below the crossover),
        which crossover decided (a measured table's path, or "ideal") and why a fallback was taken."""
        s = applied.hooks[0].session
        ran = {k.split(":", 1)[1]: v for k, v in s.stats.items() if k.startswith("prefill:")}
        return {
            "saved": s.cache_report()["saved_fraction"],
            "prefill": ran,
            "crossover": os.environ.get(crossover.ENV) or "ideal",
            "fallbacks": list(s.fallbacks),
        }


@register
@dataclass(frozen=True)
class HybridAttention(SessionPolicy):
    """`full` heads keep causal attention; the rest keep `sink` + `window` keys (prefill, or also decoding)."""

    name: ClassVar[str] = "hybrid"
    full: tuple[tuple[int, int], ...] = ()
    sink: int = DEFAULT_SINK
    window: int = DEFAULT_WINDOW
    decode: str = "full"  # "stream": the streaming heads keep their pattern in decoding (trimmed cache)
    kernel: str = "auto"
    dense_below: float | None = kernels.DENSE_BELOW
    source: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "full", self.plain().full)  # sorted, checked

    @classmethod
    def of(cls, policy: HybridPolicy, **options: Any) -> HybridAttention:
        """Return the policy of a `HybridPolicy` (full set, S, W, source) with `options` (decode, kernel...)."""
        return cls(policy.full, policy.sink, policy.window, source=policy.source, **options)

    def plain(self) -> HybridPolicy:
        """Return the full set, S and W as the kernels take them."""
        return HybridPolicy(tuple(tuple(p) for p in self.full), self.sink, self.window, self.source)

    def session(self, model: Any) -> Hybrid:
        """Return a new hybrid session on `model`."""
        return Hybrid(model, self.plain(), self.kernel, self.decode, self.dense_below)
