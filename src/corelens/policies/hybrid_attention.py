"""`hybrid`: a full set of heads keeps causal attention, every other head streams (S sinks + a W window).

docs/methods.md#hybrid. The kernels, the session and its trimmed cache are `corelens.attention.streaming`; this
policy is their plain data, and its JSON (`to_json`) the one hybrid policy file (an older file converts:
`Policy.from_file`). `plan()` is what the kernels read (`HybridPlan`). `generate` passes the session's cache;
`report` says what it saved and which prefill kernels ran.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from corelens.attention import kernels
from corelens.attention.kernels import crossover
from corelens.attention.streaming import DEFAULT_SINK, DEFAULT_WINDOW, Hybrid, HybridPlan
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
    """`full` heads keep causal attention; the rest keep `sink` + `window` keys (prefill, or also decoding).

    `kernel`: "auto", "blocked", "flex", "partitioned" or "reference" (prefill only; streamed decoding is
    exact-masked). `dense_below`: the partitioned kernel's crossover: a layer whose head set's ideal speed-up
    is below it runs every head dense (the session's `stats["prefill:dense"]` counts them; None: never).
    `decode`: "full" (every head attends to every cached key after the hybrid prefill, as in the paper) or
    "stream" (the streaming heads keep their pattern in decoding; the session's `cache()` trims their KV heads).
    The full heads chosen per prompt: `corelens.policies.AdaptiveHybrid`.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import quickstart
        >>> m, samples = quickstart(getfixture("tmp_path"), 1)
        >>> inputs = cl.prepare(m, samples[0]).inputs
        >>> def answer(**kw):  # two greedy tokens
        ...     out = m.model.generate(**inputs, max_new_tokens=2, do_sample=False, **kw)
        ...     return m.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
        >>> answer()
        'green cross'
        >>> core = [(0, 5), (0, 6), (0, 7), (1, 0)]  # the organism's top 4 heads (`cl.rank`)
        >>> with HybridAttention(core, sink=4, window=8).applied(m):  # the other 28: 4 sinks + the 8 latest keys
        ...     answer()
        'green cross'
        >>> stream = HybridAttention(core, sink=4, window=8, decode="stream")  # also while decoding
        >>> with stream.applied(m) as on:
        ...     h = on.hooks[0].session
        ...     answer(cache=h.cache()), round(h.cache_report()["saved_fraction"], 2)  # 57 % of the cache freed
        ('green <|im_end|>', 0.57)
        >>> Policy.from_json(stream.to_json()) == stream
        True
    """

    name: ClassVar[str] = "hybrid"
    full: tuple[tuple[int, int], ...] = ()
    sink: int = DEFAULT_SINK
    window: int = DEFAULT_WINDOW
    decode: str = "full"  # "stream": the streaming heads keep their pattern in decoding (trimmed cache)
    kernel: str = "auto"
    dense_below: float | None = kernels.DENSE_BELOW
    source: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "full", self.plan().full)  # sorted, checked

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
        **options: Any,
    ) -> HybridAttention:
        """Return the policy keeping `keep` heads ("10%", 0.1 or a count) of a heads.csv table full
        (`HybridPlan.from_heads`: `kind`, `seed`, `random_from`; a KV-head table keeps whole KV heads), with
        `options` (decode, kernel, dense_below)."""
        plan = HybridPlan.from_heads(
            heads, keep, kind=kind, seed=seed, sink=sink, window=window, random_from=random_from
        )
        return cls.of(plan, **options)

    @classmethod
    def of(cls, plan: HybridPlan, **options: Any) -> HybridAttention:
        """Return the policy of a `HybridPlan` (full set, S, W, source) with `options` (decode, kernel...)."""
        return cls(plan.full, plan.sink, plan.window, source=plan.source, **options)

    def plan(self) -> HybridPlan:
        """Return the full set, S and W as the kernels take them."""
        return HybridPlan(tuple(tuple(p) for p in self.full), self.sink, self.window, self.source)

    def session(self, model: Any) -> Hybrid:
        """Return a new hybrid session on `model`."""
        return Hybrid(model, self.plan(), self.kernel, self.decode, self.dense_below)
