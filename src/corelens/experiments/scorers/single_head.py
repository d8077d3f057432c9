"""`causal`: each head's single-head effect, the drop in the gold answer's log-probability when the head
alone is intervened on (`zero` or `knockout`), as `corelens importance` measures it (docs/importance.md,
docs/methods.md#causal-score).

The measurement is importance's own (`experiments.importance`: `answer_logp` under `operator_policy`, or the
attribution-patching estimate `attribution`), per sample, with the answer teacher-forced: `effect="exact"`
costs one forward per head and sample (plus the baseline), `effect="attribution"` one forward and one backward
per sample. The greedy-accuracy drop that importance also measures is not computed (a ranking needs log p).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from corelens.data.sample import Sample
from corelens.errors import OptionError
from corelens.experiments.ablate import operator_policy
from corelens.experiments.importance import answer_logp, attribution, blocked_positions
from corelens.experiments.scorers.base import ForcedScorer, ScoreJob, register
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared

EFFECTS = ("exact", "attribution")


@register
@dataclass(frozen=True)
class Causal(ForcedScorer):
    """Drop in log p(gold answer) when one head alone is intervened on with `op` (`keys`: knockout's set)."""

    name: ClassVar[str] = "causal"
    label: ClassVar[str] = "single-head effect"
    op: str = "zero"
    keys: str = "visual"
    effect: str = "exact"

    def __post_init__(self) -> None:
        if self.effect not in EFFECTS:
            raise OptionError(f"--effect must be one of {EFFECTS}, got {self.effect!r}")
        if self.op not in ("zero", "knockout"):
            raise OptionError(f"--op must be zero or knockout for single-head effects, got {self.op!r}")

    def measure(self, m: Loaded, sample: Sample, forced: Prepared, job: ScoreJob) -> dict:
        """Return the sample's record: each head's log-p drop (exact: one forward per head)."""
        blocked = blocked_positions(
            sample, forced, self.op, self.keys
        )  # a bad Omega fails before any forward
        if self.effect == "attribution":
            drops = attribution(m, sample, forced, self.op, self.keys)
        else:
            with torch.no_grad():
                base = float(answer_logp(m, forced))
                drops = np.zeros((m.num_layers, m.num_heads))
                for layer in range(m.num_layers):
                    for head in range(m.num_heads):
                        policy = operator_policy(self.op, self.keys, ((layer, head),))
                        with policy.applied(m, forced, sample=sample):
                            drops[layer, head] = base - float(answer_logp(m, forced))
        return {
            "id": sample.id,
            "task": sample.task,
            "status": "ok",
            "n_omega": 0 if blocked is None or self.keys != "omega" else len(blocked),
            "n_visual": len(forced.layout.visual),
            "mass": drops.tolist(),
            "share": np.full_like(drops, np.nan).tolist(),
            "lift": np.full_like(drops, np.nan).tolist(),
        }
