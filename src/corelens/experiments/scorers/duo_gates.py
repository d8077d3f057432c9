"""`gates`: DuoAttention's learned gate of each head, trained on the run's own samples (docs/methods.md#gates).

`experiments.gates.fit_gates` does the work (the gated attention inside the one attention function, the
loss, Adam, the clamp, the checkpoint); this scorer runs it in the rank run's folder (`gates.pt`: a killed run
resumes), writes the loss curve as a table (`gate_losses.csv`) and a figure (`figures/gate_loss.png`) and the
learned gates (`gates.csv`), and returns one record (id "all": one optimisation, so heads.csv has no
intervals or P(top-k)) whose `mass` is each query head's alpha (a KV gate's alpha on each of its query heads). The rank's
`--granularity` is the gates': "kv" trains one gate per KV head, as DuoAttention does for GQA models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from corelens.data.sample import Sample
from corelens.errors import OptionError
from corelens.experiments.gates import GateResult, GateSettings, fit_gates
from corelens.experiments.scorers.base import ScoreJob, Scorer, register
from corelens.models.loaded import Loaded


def token_count(value: str, option: str) -> int:
    """Return a sink / window given as a token count; a share of the prompt is refused (one pattern is trained)."""
    try:
        return int(value)
    except ValueError:
        raise OptionError(f"{option} {value!r}: this scorer needs a token count (its pattern is shared by all "
                          "samples), not a share") from None  # fmt: skip


@register
@dataclass(frozen=True)
class Gates(Scorer):
    """DuoAttention's gates: alpha * full + (1 - alpha) * (sink + window) per head, learned with weights frozen."""

    name: ClassVar[str] = "gates"
    label: ClassVar[str] = "learned gate (DuoAttention)"
    sink: str = "128"
    window: str = "1024"
    granularity: str = "query"
    gate_loss: str = "hidden"
    gate_lambda: float = 0.05
    gate_lr: float = 0.02
    gate_epochs: int = 2
    gate_batch: int = 4
    gate_seed: int = 0

    def settings(self) -> GateSettings:
        """Return the optimisation's settings."""
        return GateSettings(
            sink=token_count(self.sink, "--sink"),
            window=token_count(self.window, "--window"),
            loss=self.gate_loss,
            granularity=self.granularity,
            lam=self.gate_lambda,
            lr=self.gate_lr,
            epochs=self.gate_epochs,
            batch=self.gate_batch,
            seed=self.gate_seed,
        )

    def score(self, m: Loaded, samples: list[Sample], job: ScoreJob) -> list[dict]:
        """Return the one record of the learned gates (module docstring); write the loss curve in the run."""
        folder = None if job.run is None else job.run.path
        result = fit_gates(
            m, samples, self.settings(), folder=folder, dist=job.ctx.launch, progress=job.ctx.progress
        )
        alpha = result.alpha
        if alpha.shape[1] != m.num_heads:  # KV gates: each on its query heads
            alpha = np.repeat(alpha, m.num_heads // alpha.shape[1], axis=1)
        if job.run is not None and job.ctx.main:
            write_outputs(job.run, result)
        nan = np.full_like(alpha, np.nan).tolist()
        tasks = sorted({s.task for s in samples})
        return [{"id": "all", "task": tasks[0] if len(tasks) == 1 else "mixed", "status": "ok", "n_omega": 0,
                 "n_visual": 0, "mass": alpha.tolist(), "share": nan, "lift": nan, "steps": result.steps}]  # fmt: skip


def write_outputs(run, result: GateResult) -> None:
    """Write the loss curve (table and figure) and the gates table into the run folder."""
    from corelens.report.figure import plt, save_figure

    run.table(result.losses, "gate_losses.csv")
    run.table(result.table(), "gates.csv")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    losses = result.losses
    ax.plot(losses["step"], losses["loss"], label="loss")
    ax.plot(losses["step"], losses["distance"], label=f"distance ({result.settings.loss})")
    ax.plot(losses["step"], losses["reg"], label="λ · mean α")
    ax.set_xlabel("step")
    ax.set_yscale("log")
    ax.set_title(f"Gate optimisation (S={result.settings.sink}, W={result.settings.window})")
    ax.legend()
    save_figure(fig, run.path / "figures" / "gate_loss.png")
