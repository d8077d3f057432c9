"""A local lmms-eval task for a corelens sample file: the task's functions, and the writer of its folder.

The task folder holds `NAME.yaml` (lmms-eval's task format, written with PyYAML: a JSON dataset read by `datasets`' json builder, no
download), `NAME.json` (the samples, image paths made absolute) and `NAME_utils.py` (the functions below, which
lmms-eval's `!function` tag loads from the folder). The question is the prompt text and the images are the
visuals, so the corelens model builds the same sample as corelens' own harness; `accuracy` is corelens'
scorer (`corelens.metrics.answers.score`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from corelens.data.sample import read_samples
from corelens.errors import CorelensError
from corelens.metrics.answers import SCORERS, score


def doc_to_visual(doc: dict[str, Any]) -> list[Image.Image]:
    """Return the sample's images, as RGB PIL images."""
    images = []
    for path in doc.get("images") or []:
        with Image.open(path) as im:
            images.append(im.convert("RGB"))
    return images


def doc_to_text(doc: dict[str, Any], lmms_eval_specific_kwargs: dict | None = None) -> str:
    """Return the question, as corelens asks it."""
    return doc["question"]


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """Return {"accuracy": 1.0 or 0.0} for the model's answer, scored as corelens scores it."""
    correct = score(results[0], doc["answer"], doc.get("choices"), doc.get("scorer") or "auto")
    return {"accuracy": float(correct)}


class _Function(str):
    """A `!function module.name` value of a task YAML (lmms-eval loads the function from the task folder)."""


def _function(dumper: yaml.SafeDumper, value: _Function) -> yaml.ScalarNode:
    return dumper.represent_scalar("!function", str(value))


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing `_Function` values under lmms-eval's `!function` tag."""


_Dumper.add_representer(_Function, _function)


def task_config(name: str, data: Path, max_new_tokens: int) -> dict[str, Any]:
    """Return the task's lmms-eval configuration: a JSON dataset read by `datasets`, no download."""
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_visual": _Function(f"{name}_utils.doc_to_visual"),
        "doc_to_text": _Function(f"{name}_utils.doc_to_text"),
        "doc_to_target": "answer",
        "process_results": _Function(f"{name}_utils.process_results"),
        "generation_kwargs": {"max_new_tokens": max_new_tokens, "do_sample": False, "until": []},
        "metric_list": [{"metric": "accuracy", "aggregation": "mean", "higher_is_better": True}],
    }


_UTILS = '''"""Functions of the lmms-eval task {name}, written by corelens."""

from corelens.integrations.lmms_eval.task import doc_to_text, doc_to_visual, process_results  # noqa: F401
'''


def write_task(samples: str | Path, out: str | Path, name: str = "corelens_samples", *,
               max_new_tokens: int = 8, scorer: str = "auto") -> Path:  # fmt: skip
    """Write the lmms-eval task folder of a corelens sample file (answers required); return its YAML."""
    if not name.isidentifier():
        raise CorelensError(f"task name {name!r}: use letters, digits and underscores")
    if scorer not in SCORERS:
        raise CorelensError(f"scorer {scorer!r}: expected one of {SCORERS}")
    found, _ = read_samples(samples)
    missing = [s.id for s in found if s.answer is None or not s.images or s.video is not None]
    if missing:
        raise CorelensError(
            f"{samples}: sample {missing[0]!r} needs images and an answer for an lmms-eval task"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = [
        {
            "id": s.id,
            "question": s.question,
            "images": [str(p.resolve()) for p in s.images],
            "answer": s.answer,
            "choices": list(s.choices) if s.choices else None,
            "scorer": scorer,
        }  # fmt: skip
        for s in found
    ]
    (out / f"{name}.json").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    (out / f"{name}_utils.py").write_text(_UTILS.format(name=name))
    config = task_config(name, (out / f"{name}.json").resolve(), max_new_tokens)
    # Written by PyYAML: a path with spaces, '#' or ':' is quoted as YAML needs, never cut.
    path = out / f"{name}.yaml"
    path.write_text(yaml.dump(config, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
    return path
