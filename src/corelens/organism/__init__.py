"""The model organism: synthetic tasks, a tiny Qwen2.5-VL trained on them, and the shipped checkpoint."""

from __future__ import annotations

from pathlib import Path

from corelens.errors import CorelensError

CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"


def organism_path() -> Path:
    """Return the folder of the shipped organism checkpoint (config, weights, tokenizer, processor, card)."""
    if not (CHECKPOINT / "config.json").is_file():
        raise CorelensError(
            f"{CHECKPOINT}: the organism checkpoint is missing (train it: corelens organism train)"
        )
    return CHECKPOINT
