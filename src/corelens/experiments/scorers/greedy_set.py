"""`greedy`: the kept-full (or zeroed) set grown one head at a time by its effect on the answer's log-likelihood
(docs/methods.md#greedy).

`experiments.greedy.greedy_heads` does the work; this scorer runs it in the rank run's folder (`greedy.json`
after each step: a killed run resumes after its last step), writes the selection (`greedy.csv`: rank, head,
gain, set value) and returns one record (id "all": one selection, so heads.csv has no intervals or P(top-k)) whose
`mass` is budget + 1 - the head's selection rank (the first chosen highest) and 0 for heads never chosen;
the gains are in `greedy.csv`. The rank's `--granularity` is the selection's: "kv" selects whole KV heads
(`experiments.greedy`), and each query head's `mass` is its KV head's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from corelens.data.sample import Sample
from corelens.experiments.greedy import GreedySettings, greedy_heads
from corelens.experiments.scorers.base import ScoreJob, Scorer, register
from corelens.experiments.scorers.duo_gates import token_count
from corelens.models.loaded import Loaded


@register
@dataclass(frozen=True)
class Greedy(Scorer):
    """Greedy joint selection: the head whose addition most raises log p (hybrid) or lowers it (ablate)."""

    name: ClassVar[str] = "greedy"
    label: ClassVar[str] = "greedy selection"
    sink: str = "128"
    window: str = "1024"
    greedy_mode: str = "hybrid"
    greedy_budget: int = 8
    greedy_batch: int = 32
    granularity: str = "query"

    def to_dict(self) -> dict:
        """Return the scorer as data; a query-head selection records no granularity (as before KV selection),
        so that runs started then still resume."""
        data = super().to_dict()
        if data["granularity"] == "query":
            del data["granularity"]
        return data

    def settings(self) -> GreedySettings:
        """Return the selection's settings."""
        return GreedySettings(
            mode=self.greedy_mode,
            budget=self.greedy_budget,
            sink=token_count(self.sink, "--sink"),
            window=token_count(self.window, "--window"),
            batch=self.greedy_batch,
            granularity=self.granularity,
        )

    def score(self, m: Loaded, samples: list[Sample], job: ScoreJob) -> list[dict]:
        """Return the one record of the selection (module docstring); write greedy.csv in the run."""
        folder = None if job.run is None else job.run.path
        settings = self.settings()
        result = greedy_heads(
            m, samples, settings, folder=folder, dist=job.ctx.launch, progress=job.ctx.progress
        )
        group = m.num_heads // m.num_kv_heads if settings.granularity == "kv" else 1
        mass = np.zeros((m.num_layers, m.num_heads))
        for rank, (layer, unit) in enumerate(result.order, start=1):
            mass[layer, unit * group : (unit + 1) * group] = settings.budget + 1 - rank
        if job.run is not None and job.ctx.main:
            job.run.table(result.table(), "greedy.csv")
        nan = np.full_like(mass, np.nan).tolist()
        tasks = sorted({s.task for s in samples})
        return [{"id": "all", "task": tasks[0] if len(tasks) == 1 else "mixed", "status": "ok", "n_omega": 0,
                 "n_visual": 0, "mass": mass.tolist(), "share": nan, "lift": nan, "base": result.base}]  # fmt: skip
