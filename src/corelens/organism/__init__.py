"""The model organism: synthetic tasks, a tiny Qwen2.5-VL trained on them, and the shipped checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from corelens.errors import CorelensError

if TYPE_CHECKING:
    from corelens.data import Sample
    from corelens.models import Loaded

CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"


def organism_path() -> Path:
    """Return the folder of the shipped organism checkpoint (config, weights, tokenizer, processor, card)."""
    if not (CHECKPOINT / "config.json").is_file():
        raise CorelensError(
            f"{CHECKPOINT}: the organism checkpoint is missing (train it: corelens organism train)"
        )
    return CHECKPOINT


def quickstart(
    folder: str | Path, n: int = 1, task: str = "image", seed: int = 1
) -> tuple[Loaded, list[Sample]]:
    """Return the organism loaded on the CPU and `n` `task` samples generated into `folder` (sample seed `seed`):
    a first try in one line, and the setup of the library's examples.

    Examples:
        >>> from corelens.organism import quickstart
        >>> m, samples = quickstart(getfixture("tmp_path"), 2)
        >>> m.num_layers, m.num_heads, [s.id for s in samples]
        (4, 8, ['image-00000', 'image-00001'])
    """
    from corelens.data import read_samples
    from corelens.models import load
    from corelens.organism.tasks import generate

    m = load(organism_path(), device="cpu")
    samples, _ = read_samples(generate(task, folder, n, seed=seed))
    return m, samples
