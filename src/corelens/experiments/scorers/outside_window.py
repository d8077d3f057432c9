"""`outside-window`: the attention mass of the probed rows outside sink + window, what a streaming head
(S sinks and the W latest keys, as `hybrid` keeps them) loses (docs/methods.md#outside-window-score).

The score kvpress' DuoAttention "on the fly" press and mlx-lm compute without training. Row r keeps the keys
k < S and r - W < k <= r; the head's score is the mean over the `--query` rows of its mass on every other
key. S and W are token counts or shares of each sample's prompt ("25%", the prompt without an appended
answer), resolved per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from corelens.attention import activate
from corelens.attention.probes import OutsideWindowProbe
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample
from corelens.experiments.hybrid import resolve_size
from corelens.experiments.scorers.base import SampleScorer, ScoreJob, register
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared


@register
@dataclass(frozen=True)
class OutsideWindow(SampleScorer):
    """Mean attention mass of the `--query` rows outside the first `sink` and the `window` latest keys."""

    name: ClassVar[str] = "outside-window"
    label: ClassVar[str] = "mass outside sink + window"
    sink: str = "128"
    window: str = "1024"

    def sizes(self, prompt: int) -> tuple[int, int]:
        """Return (S, W) in tokens for a prompt of `prompt` tokens (a share is of this prompt)."""
        sink, window = resolve_size(self.sink, [prompt]), resolve_size(self.window, [prompt])
        if sink < 0 or window < 1:
            from corelens.errors import OptionError

            raise OptionError(f"need --sink >= 0 and --window >= 1, got {self.sink} and {self.window}")
        return sink, window

    def measure(self, m: Loaded, sample: Sample, prepared: Prepared, job: ScoreJob) -> dict:
        """Return the sample's record: one probed forward."""
        probe = job.shared("outside-window-probe", lambda: OutsideWindowProbe(m.num_layers, m.num_heads))
        probe.sink, probe.window = self.sizes(prepared.seq_len - len(prepared.answer_rows))
        rows = prepared.rows(job.cfg.query)
        context = AttentionContext.of(prepared, sample=sample, query_rows=rows)
        with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
            m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
        lost = probe.values.double().numpy()
        return {
            "id": sample.id,
            "task": sample.task,
            "status": "ok",
            "n_omega": 0,
            "n_visual": len(prepared.layout.visual),
            "mass": lost.tolist(),
            "share": np.full_like(lost, np.nan).tolist(),
            "lift": np.full_like(lost, np.nan).tolist(),
            "sink": probe.sink,
            "window": probe.window,
        }
