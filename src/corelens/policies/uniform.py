"""`uniform`: each chosen head's query is zeroed, so its softmax is uniform over the keys its mask allows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corelens.attention.dispatch import AttentionCall
from corelens.policies.core import register
from corelens.policies.heads import HeadsHook, HeadsPolicy


class UniformHook(HeadsHook):
    """Zeroes the chosen heads' queries before the kernel."""

    kind = "query"
    name = "uniform ablation"

    def pre(self, call: AttentionCall) -> None:
        """Replace the call's queries by copies with the chosen heads zeroed."""
        call.query = call.query.index_fill(1, self.index(call.layer, call.query.device), 0.0)


@register
@dataclass(frozen=True)
class UniformHeads(HeadsPolicy):
    """Uniform-attention ablation of `heads`."""

    name: ClassVar[str] = "uniform"

    def hooks(self, model, context) -> list[UniformHook]:
        """Return the hook on the layers holding `heads`."""
        return [UniformHook(self.by_layer(model))]
