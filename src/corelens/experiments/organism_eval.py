"""Held-out evaluation of an organism: accuracy, blanked-visual accuracy, chance and text-only baselines.

Samples are generated with a seed disjoint from training (training uses seed 0) and answered greedily
through `corelens.experiments.evaluate.evaluate`, once as they are and once with every image and frame
replaced by uniform grey (`blank_accuracy`). Two text-only baselines bound what the question alone gives
away: `majority_accuracy` (the most frequent answer of the task's training samples) and
`text_only_accuracy` (the most frequent training answer of the exact same question text, falling back to
the task majority): with discrete questions this is the best any question-only predictor can do.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from corelens.data.sample import read_samples
from corelens.errors import OptionError
from corelens.experiments.evaluate import evaluate
from corelens.metrics.answers import interval
from corelens.models.loaded import Loaded, load
from corelens.organism.config import TRAIN_DATA_SEED
from corelens.organism.tasks import TASKS, generate, render

DEFAULT_SEED = 1
BASELINE_TRAIN = 600  # training samples per task that fit the text-only baselines


def text_only_predictor(task: str, n: int = BASELINE_TRAIN, seed: int = TRAIN_DATA_SEED):
    """Return (question -> answer, task majority answer) fitted on `n` training samples of `task`."""
    by_question: dict[str, Counter] = {}
    overall: Counter = Counter()
    for i in range(n):
        record = render(task, i, seed).record
        by_question.setdefault(record["question"], Counter())[record["answer"]] += 1
        overall[record["answer"]] += 1
    # Ties break by answer text so the baseline is deterministic.
    best = {q: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for q, c in by_question.items()}
    return best, min(overall.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def evaluate_organism(
    model: str | Path | Loaded,
    *,
    n: int = 200,
    seed: int = DEFAULT_SEED,
    tasks: tuple[str, ...] = TASKS,
    data: str | Path | None = None,
    baseline_train: int = BASELINE_TRAIN,
    progress: bool = False,
    load_options: dict | None = None,
) -> dict:
    """Return per-task accuracy, blank_accuracy, chance, n and text-only baselines on `n` held-out samples."""
    if seed == TRAIN_DATA_SEED:
        raise OptionError(f"seed {seed} is the training seed; evaluate on another seed")
    m = model if isinstance(model, Loaded) else load(model, **(load_options or {}))
    start = time.time()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(data) if data is not None else Path(tmp)
        for task in tasks:
            samples, _ = read_samples(generate(task, root / task, n, seed=seed))
            normal = evaluate(m, samples, progress=progress)
            blank = evaluate(m, samples, blank=True, progress=progress)
            best, majority = text_only_predictor(task, baseline_train)
            text_only = sum(best.get(s.question, majority) == s.answer for s in samples) / len(samples)
            correct = int(normal.records["correct"].sum())
            results[task] = {
                "accuracy": normal.accuracy,
                "accuracy_ci": list(interval(correct, normal.n)),
                "blank_accuracy": blank.accuracy,
                "chance": sum(1.0 / len(s.choices or ["?"]) for s in samples) / len(samples),
                "n": normal.n,
                "text_only_accuracy": text_only,
                "majority_accuracy": sum(s.answer == majority for s in samples) / len(samples),
            }
    return {
        "model": str(m.path),
        "seed": seed,
        "n_per_task": n,
        "tasks": results,
        "text_only_baseline": (
            f"most frequent answer of the same question text in {baseline_train} training samples per task "
            f"(seed {TRAIN_DATA_SEED}), else the task's most frequent answer"
        ),
        "seconds": round(time.time() - start, 1),
    }
