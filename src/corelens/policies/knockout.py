"""`knockout`: each chosen head's scores on a key set (all visual tokens, or Omega) are masked before the
softmax and the rest renormalises; a query row left with no key outputs 0 for that head **[decision]**.

The key set is read from the call's context (`AttentionCall.context`): absolute positions, so decoding steps
mask the same keys as the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from corelens.attention.dispatch import AttentionCall, Kernel
from corelens.attention.interventions import knockout_kernel
from corelens.attention.prompt_context import needs
from corelens.choices import KEY_SETS
from corelens.errors import OptionError
from corelens.policies.core import register
from corelens.policies.heads import HeadsHook, HeadsPolicy


class KnockoutHook(HeadsHook):
    """Recomputes the chosen heads without the blocked keys (a kernel that wraps the inner one)."""

    kind = "pattern"
    name = "knockout ablation"

    def __init__(self, by_layer, keys: str) -> None:
        super().__init__(by_layer)
        self.keys = keys

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """Wrap `inner` so that the chosen heads are recomputed without the key set."""
        context = needs(call.context, self.name)
        batch, kv_len, device = call.query.shape[0], call.key.shape[2], call.query.device
        if self.keys == "visual":
            blocked = context.visual_mask(0, kv_len, batch, device)
        else:
            blocked = context.omega_mask(kv_len, batch, device)
        if not bool(blocked.any()):  # an empty key set leaves the call untouched
            return inner
        return knockout_kernel(inner, self.by_layer[call.layer], blocked, call.q_offset)


@register
@dataclass(frozen=True)
class KnockoutHeads(HeadsPolicy):
    """Knockout of `keys` ("visual" or "omega") in `heads`."""

    name: ClassVar[str] = "knockout"
    keys: str = "visual"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.keys not in KEY_SETS:
            raise OptionError(f"unknown knockout key set {self.keys!r}; expected one of {KEY_SETS}")

    def hooks(self, model, context) -> list[KnockoutHook]:
        """Return the hook on the layers holding `heads`."""
        return [KnockoutHook(self.by_layer(model), self.keys)]
