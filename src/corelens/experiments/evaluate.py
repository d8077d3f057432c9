"""Evaluation harness: greedy answers through the chat template, scored, as per-sample records.

How an answer is scored (`score`, `interval`, the scorers) is `corelens.metrics.answers`; its names stay
importable from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import pandas as pd
from tqdm import tqdm

from corelens import policies
from corelens.data.sample import Sample
from corelens.metrics.answers import SCORERS, choice_letter, interval, normalise, score  # noqa: F401 (as before)
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare
from corelens.policies import Policy


def answer(
    m: Loaded,
    sample: Sample,
    *,
    max_new_tokens: int = 8,
    blank: bool = False,
    prepared: Prepared | None = None,
    policy: Policy | None = None,
) -> str:
    """Return the model's greedy answer to `sample` (new tokens only, special tokens dropped) under `policy`.

    `corelens.policies.answer` on the sample's prepared prompt: a caller answering one sample under many
    policies prepares it once and passes `prepared`.
    """
    prepared = prepared if prepared is not None else prepare(m, sample, blank=blank)
    return policies.answer(m, prepared, policy, sample=sample, max_new_tokens=max_new_tokens)


@dataclass
class EvalResult:
    """Per-sample records (id, task, prediction, gold, correct) and their accuracy."""

    records: pd.DataFrame

    @property
    def n(self) -> int:
        """Return the number of scored samples."""
        return len(self.records)

    @property
    def accuracy(self) -> float:
        """Return the share of correct answers."""
        return float(self.records["correct"].mean()) if self.n else float("nan")

    @property
    def ci(self) -> tuple[float, float]:
        """Return the 95 % Wilson interval of the accuracy."""
        return interval(int(self.records["correct"].sum()), self.n)

    def by_task(self) -> pd.DataFrame:
        """Return accuracy and n per task."""
        return self.records.groupby("task")["correct"].agg(accuracy="mean", n="size").reset_index()


def evaluate(
    m: Loaded,
    samples: Iterable[Sample],
    *,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    blank: bool = False,
    progress: bool = False,
    context: Callable[[Sample, Prepared], AbstractContextManager] | None = None,
    policy: Policy | None = None,
) -> EvalResult:
    """Answer every sample greedily under `policy` (None: unmodified) and score it; samples without `answer`
    are an error. `context(sample, prepared)`, if given, is entered around each sample's generation.
    """
    rows = []
    for sample in tqdm(list(samples), desc="eval", unit="sample", disable=not progress):
        if sample.answer is None:
            raise ValueError(f"sample {sample.id!r} has no answer to score against")
        prepared = prepare(m, sample, blank=blank)
        with context(sample, prepared) if context is not None else nullcontext():
            prediction = answer(m, sample, max_new_tokens=max_new_tokens, prepared=prepared, policy=policy)
        rows.append(
            {
                "id": sample.id,
                "task": sample.task,
                "prediction": prediction,
                "gold": sample.answer,
                "correct": score(prediction, sample.answer, sample.choices, scorer),
            }
        )
    columns = ["id", "task", "prediction", "gold", "correct"]
    return EvalResult(pd.DataFrame(rows, columns=columns))
