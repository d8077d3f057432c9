"""`zero`: each chosen head's output (its slice of the `o_proj` input) is set to 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from corelens.attention.dispatch import AttentionCall
from corelens.policies.core import register
from corelens.policies.heads import HeadsHook, HeadsPolicy


class ZeroHook(HeadsHook):
    """Zeroes the chosen heads' outputs after the kernel."""

    kind = "output"
    name = "zero ablation"

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Return the output with the chosen heads set to 0."""
        return output.index_fill(2, self.index(call.layer, output.device), 0.0)


@register
@dataclass(frozen=True)
class ZeroHeads(HeadsPolicy):
    """Zero ablation of `heads`."""

    name: ClassVar[str] = "zero"

    def hooks(self, model, context) -> list[ZeroHook]:
        """Return the hook on the layers holding `heads`."""
        return [ZeroHook(self.by_layer(model))]
