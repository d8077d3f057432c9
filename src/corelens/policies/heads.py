"""What the head operators (zero / mean / uniform / knockout, docs/methods.md#interventions) share.

`HeadsPolicy`: the (layer, query head) pairs a policy acts on, sorted and without duplicates, checked against
the model; `HeadsHook`: a hook on the layers holding those heads, with each layer's head indices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from corelens.attention.dispatch import AttentionHook
from corelens.errors import CorelensError
from corelens.policies.core import Policy, model_shape


@dataclass(frozen=True)
class HeadsPolicy(Policy):
    """A policy on a set of (layer, query head) pairs; `label` / `seed` / `meta` say where the set came from."""

    heads: tuple[tuple[int, int], ...] = ()
    label: str = ""  # free text, e.g. "top/5%"
    seed: int | None = None  # the seed that drew `heads`, when they were drawn at random
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise so equal policies compare (and hash their JSON) equal, whatever the input container.
        object.__setattr__(self, "heads", tuple(sorted({(int(lh[0]), int(lh[1])) for lh in self.heads})))

    def by_layer(self, model: Any) -> dict[int, torch.Tensor]:
        """Return {layer: its heads as a long tensor}, after checking every head against the model's shape."""
        layers, heads = model_shape(model)
        out: dict[int, list[int]] = {}
        for layer, head in self.heads:
            if not (0 <= layer < layers and 0 <= head < heads):
                raise CorelensError(
                    f"head (layer {layer}, head {head}) is outside the model ({layers} layers x {heads} heads)"
                )
            out.setdefault(layer, []).append(head)
        return {layer: torch.tensor(hs, dtype=torch.long) for layer, hs in out.items()}


class HeadsHook(AttentionHook):
    """A hook active on the layers of `by_layer` only; `index(call, device)` is the call's heads."""

    def __init__(self, by_layer: dict[int, torch.Tensor]) -> None:
        self.by_layer = by_layer
        self.layers = tuple(by_layer)

    def index(self, layer: int, device: torch.device) -> torch.Tensor:
        """Return this layer's head indices on `device`."""
        return self.by_layer[layer].to(device)
