"""`adaptive-hybrid`: hybrid attention whose full heads are chosen per prompt during its prefill.

docs/methods.md#adaptive-hybrid. Each layer keeps as many full heads as the fixed set `full` holds there
(without `full`: round(budget x H)); the `rows` last prompt rows' visual mass, read with the visual positions
of the call's context, chooses which (`corelens.attention.adaptive`). `signal` (layers x heads) replaces the
measured signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from corelens.attention.adaptive import adaptive_session
from corelens.attention.streaming import DEFAULT_SINK, DEFAULT_WINDOW, Hybrid, HybridPlan
from corelens.policies.core import register
from corelens.policies.hybrid_attention import SessionPolicy


@register
@dataclass(frozen=True)
class AdaptiveHybrid(SessionPolicy):
    """Hybrid attention with `budget` of the heads full, chosen per prompt (decoding is full)."""

    name: ClassVar[str] = "adaptive-hybrid"
    budget: float = 0.1
    full: tuple[tuple[int, int], ...] | None = None  # the fixed set whose per-layer counts are kept
    sink: int = DEFAULT_SINK
    window: int = DEFAULT_WINDOW
    rows: int = 16
    kernel: str = "auto"
    signal: Any = None  # a layers x heads table (or DataFrame) replacing the measured signal

    def __post_init__(self) -> None:
        if self.full is not None:  # sorted pairs, whatever the container (JSON gives lists)
            object.__setattr__(self, "full", HybridPlan(self.full, self.sink, self.window).full)

    def session(self, model: Any) -> Hybrid:
        """Return a new adaptive session on `model`."""
        prior = None if self.full is None else HybridPlan(self.full, self.sink, self.window)
        return adaptive_session(
            model, self.budget, prior=prior, signal=self.signal, rows=self.rows,
            sink=self.sink, window=self.window, kernel=self.kernel, decode="full",
        )  # fmt: skip
