"""`retrieval`: Retrieval_Head's copy score adapted to visual evidence as SparseMM does
(docs/methods.md#retrieval-score).

While the answer is produced, a head scores when its top-1 key lies in Omega. The answer is teacher-forced on
the gold answer in one forward: the rows read are those that predict each answer token (the last prompt token
through the answer's last but one), which are the rows greedy decoding runs when it produces the gold answer.
Only samples answered correctly count, where "correct" is decided on the same forward: the model's greedy
choice at every one of those rows is the gold token (so the teacher-forced rows are the generated ones).
A sample's score of a head is its hit rate over those rows divided by |Omega| (SparseMM's 1 / box size);
`share` holds the hit rate itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from corelens.attention import activate
from corelens.attention.probes import TopKeyProbe
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample
from corelens.errors import InputError
from corelens.experiments.scorers.base import ForcedScorer, ScoreJob, register
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared


@register
@dataclass(frozen=True)
class Retrieval(ForcedScorer):
    """Share of the answer-predicting rows whose top-1 key is in Omega, over |Omega|; correct answers only
    (`all_answers=True`: every sample)."""

    name: ClassVar[str] = "retrieval"
    label: ClassVar[str] = "retrieval score"
    all_answers: bool = False

    def measure(self, m: Loaded, sample: Sample, prepared: Prepared, job: ScoreJob) -> dict:
        """Return the sample's record, or a skipped one when it has no Omega or was answered wrongly."""
        omega, reason = self.omega(m, sample, prepared, job)
        if omega is None:
            return self.skip(sample, reason)
        if not len(omega):
            raise InputError(
                "the targets cover no visual token", file=sample.source, line=sample.line, sample=sample.id
            )
        answer = np.asarray(prepared.answer_rows)
        rows = answer - 1  # the row before each answer token predicts it
        probe = job.shared("top-key-probe", lambda: TopKeyProbe(m.num_layers, m.num_heads))
        context = AttentionContext.of(prepared, omega=omega, sample=sample, query_rows=rows)
        inputs = prepared.to(m.device)
        with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
            logits = m.model(**inputs, use_cache=False, logits_to_keep=len(rows) + 1).logits[0, :-1]
        gold = inputs["input_ids"][0, torch.as_tensor(answer, device=logits.device)]
        correct = bool((logits.argmax(-1) == gold).all())
        if not (self.all_answers or correct):
            return self.skip(sample, "answered wrongly: the retrieval score counts correct answers only")
        hits = probe.values.double().numpy()
        visual = len(prepared.layout.visual)
        return {
            "id": sample.id,
            "task": sample.task,
            "status": "ok",
            "n_omega": len(omega),
            "n_visual": visual,
            "mass": (hits / len(omega)).tolist(),
            "share": hits.tolist(),
            "lift": np.full_like(hits, np.nan).tolist(),
            "correct": correct,
        }
