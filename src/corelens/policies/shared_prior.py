"""`sap`: shared attention priors (docs/methods.md#sap): the visual part of the current query rows'
attention, on a layer set and head set, is replaced by a registered prior (`corelens.policies.sap_priors`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from corelens.attention.priors import CONVENTIONS, SapHook, parse_heads, parse_layers
from corelens.errors import CorelensError, OptionError
from corelens.policies.core import Policy, register
from corelens.policies.sap_priors import PRIOR_CLASSES, build_prior


@register
@dataclass(frozen=True)
class SharedPrior(Policy):
    """Prior `prior` on `layers` and `heads` under `convention` (`seed`: noise; `temperature`: key, complexity)."""

    name: ClassVar[str] = "sap"
    prior: str = "own"
    layers: str = "late"
    heads: str = "all"
    convention: str = "mass"
    seed: int = 0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        PRIOR_CLASSES[self.prior]  # an unknown prior fails here, not at the first prompt
        if self.convention not in CONVENTIONS:
            raise OptionError(f"unknown SAP convention {self.convention!r}; expected one of {CONVENTIONS}")

    def hooks(self, model, context) -> list[SapHook]:
        """Return the SAP hook on the layer set; it reads each prompt's positions and prior from its context.

        Given a context, its prior is computed now, so a prior that cannot be built fails on applying.
        """

        def prior_of(ctx) -> np.ndarray | None:
            if ctx.prepared is None:
                raise CorelensError(
                    "SAP needs the prepared prompt: apply it with `policy.applied(m, prepared)`"
                )
            return build_prior(
                model, ctx.sample, ctx.prepared, self.prior, seed=self.seed, temperature=self.temperature
            )

        hook = SapHook(
            prior=prior_of, heads=parse_heads(self.heads, model.num_heads), convention=self.convention
        )
        hook.layers = parse_layers(self.layers, model.num_layers)
        if context is not None:
            hook.prior_for(context)
        return [hook]
