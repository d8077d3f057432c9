"""Sample -> model inputs + layout + query rows, through the checkpoint's own processor and chat template.

The prompt is one user turn: the visual inputs first (images in order, then the video), then the question,
with `add_generation_prompt=True` (docs/methods.md#layout). Teacher forcing appends the answer after the prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from corelens.data.sample import Sample, load_images, load_video
from corelens.errors import InputError, OptionError, UnsupportedModelError
from corelens.layout import PADDING_RULES, Layout
from corelens.models.families import family_of
from corelens.models.loaded import Loaded, processor_only

QUERY_MODES = ("question", "last", "answer")


@dataclass
class Prepared:
    """Model inputs of one sample, its layout, and the positions of its question / answer tokens."""

    inputs: dict
    layout: Layout
    prompt_len: int  # tokens up to and including the generation prompt
    question_rows: np.ndarray
    answer_rows: np.ndarray  # empty unless teacher-forced

    def to(self, device) -> dict:
        """Return the model inputs on `device` (tensors moved; other values, such as lists of frame times, as
        they are): what `m.model(**prepared.to(m.device))` and `generate` take."""
        return {k: v.to(device) if hasattr(v, "to") else v for k, v in self.inputs.items()}

    @property
    def seq_len(self) -> int:
        """Return the number of tokens in the inputs."""
        return int(self.inputs["input_ids"].shape[1])

    def rows(self, mode: str) -> np.ndarray:
        """Return the query positions of `mode` ("question", "last" or "answer")."""
        if mode == "question":
            return self.question_rows
        if mode == "last":
            return np.array([self.prompt_len - 1])
        if mode == "answer":
            if not len(self.answer_rows):
                raise OptionError(
                    "query 'answer' needs the sample prepared with its answer (teacher forcing)"
                )
            return self.answer_rows
        raise OptionError(f"unknown query mode {mode!r}; expected one of {QUERY_MODES}")


def messages(sample: Sample) -> list[dict]:
    """Return the chat messages of a sample: one user turn, visual inputs first, then the question."""
    content = [{"type": "image"} for _ in sample.images]
    if sample.video is not None:
        content.append({"type": "video"})
    content.append({"type": "text", "text": sample.question})
    return [{"role": "user", "content": content}]


def find_subsequence(haystack: np.ndarray, needle: np.ndarray, end: int) -> int:
    """Return the start of the last occurrence of `needle` in `haystack[:end]`, or -1."""
    n = len(needle)
    for start in range(end - n, -1, -1):
        if np.array_equal(haystack[start : start + n], needle):
            return start
    return -1


def blank_like(image: Image.Image) -> Image.Image:
    """Return a uniform mid-grey image of the same size (the "visual input blanked" control)."""
    return Image.new("RGB", image.size, (128, 128, 128))


def prepare(
    m: Loaded,
    sample: Sample,
    *,
    answer: str | None = None,
    blank: bool = False,
    padding: str = "visual",
    visuals: tuple[list, list] | None = None,
) -> Prepared:
    """Return the processed inputs, layout and query rows of `sample` for model `m` (`blank`: grey visuals).

    `padding` is the layout's padding-cell rule (`corelens.layout.PADDING_RULES`): `"visual"` (default)
    counts cells that hold only padding in V but never in Omega, `"omega"` also in a whole-image Omega,
    `"none"` in neither. `visuals` = (images, frames) replaces the sample's loaded pixels (same sizes: an
    occluded copy, docs/methods.md#causal-omega).

    Examples:
        >>> from corelens.organism import quickstart
        >>> m, samples = quickstart(getfixture("tmp_path"), 1)
        >>> p = prepare(m, samples[0])
        >>> p.seq_len, len(p.layout.visual), p.question_rows.tolist()  # 36 image tokens, 7 question tokens
        (50, 36, [40, 41, 42, 43, 44, 45, 46])
        >>> p.layout.omega(samples[0].targets, "any").tolist()  # the image token under the target box
        [22]
    """
    if padding not in PADDING_RULES:
        raise InputError(
            f"unknown padding rule {padding!r}; expected one of {PADDING_RULES}", sample=sample.id
        )
    processor = m.processor
    images = load_images(sample)
    frames, times = load_video(sample) if sample.video is not None else ([], [])
    if visuals is not None:
        images, frames = list(visuals[0]), list(visuals[1])
    if blank:
        images, frames = [blank_like(im) for im in images], [blank_like(f) for f in frames]
    prompt = processor.apply_chat_template(messages(sample), add_generation_prompt=True, tokenize=False)
    extra = processor_kwargs(m.model_type, times, sample.video.fps if sample.video else None)
    given = [images] if images and m.family.nested_images else images or None

    def run(text: str):
        try:
            return processor(
                text=[text],
                images=given,
                videos=[frames] if frames else None,
                return_tensors="pt",
                **extra,
            )
        except (ValueError, TypeError, IndexError) as exc:
            # The processor's own checks on the pixels (a 1 x 1024 image: "aspect ratio must be smaller
            # than 200") are about this sample's input: one line naming it, or skipped under --skip-bad.
            field = "images" if images else "video"
            raise InputError(
                f"the processor rejects this sample's {field}: {type(exc).__name__}: {exc}",
                file=sample.source or None,
                line=sample.line or None,
                sample=sample.id,
                field=field,
            ) from None

    inputs = run(prompt)
    ids = inputs["input_ids"][0].numpy()
    prompt_len = len(ids)
    answer_rows = np.zeros(0, dtype=np.int64)
    if answer is not None:
        full = run(prompt + answer)
        full_ids = full["input_ids"][0].numpy()
        common = int(np.argmin(np.append(full_ids[:prompt_len] == ids, False)))
        if common < prompt_len - 1 or len(full_ids) <= common:
            raise InputError("the answer does not tokenize as a continuation of the prompt", sample=sample.id)
        answer_rows = np.arange(common, len(full_ids))
        inputs = full
        ids = full_ids
    needle = np.asarray(processor.tokenizer(sample.question, add_special_tokens=False)["input_ids"])
    start = find_subsequence(ids, needle, prompt_len) if len(needle) else -1
    if start < 0:
        raise InputError(
            "could not locate the question's tokens in the prompt", sample=sample.id, field="question"
        )
    return Prepared(
        dict(inputs),
        replace(layout_of(m, inputs, images, frames, times, sample), padding=padding),
        prompt_len,
        np.arange(start, start + len(needle)),
        answer_rows,
    )


def processor_kwargs(model_type: str, frame_times: list[float] | None, fps: float | None) -> dict:
    """Return the extra processor arguments of a prompt's video for `model_type` (none without a video)."""
    family = family_of(model_type)
    return family.processor_kwargs(frame_times, fps) if frame_times and family.video else {}


def check_geometry(m: Loaded) -> None:
    """Refuse a processor whose token geometry disagrees with the vision tower's (patch, merge, tile size).

    The layout places cells by the tower's geometry and counts tokens by the processor's; a checkpoint
    whose processor files were edited apart from its config would give a layout the model does not use.
    """
    for name, processor_value, tower_value in m.family.geometry(m):
        if processor_value is not None and int(processor_value) != int(tower_value):
            raise UnsupportedModelError(
                f"{m.path}: the processor's {name} = {processor_value} disagrees with the vision tower's "
                f"{tower_value} (config.json); the layout would not match what the model sees"
            )


def layout_of(m: Loaded, inputs, images: list, frames: list, times: list[float], sample: Sample) -> Layout:
    """Return the visual token layout of processed `inputs` for the model's family."""
    check_geometry(m)
    if frames and not m.family.video:
        raise UnsupportedModelError(f"{m.model_type} takes images only, not video (sample {sample.id})")
    return m.family.layout(m, inputs, images, frames, times, sample.id)


def prompt_length(m: Loaded, sample: Sample) -> int:
    """Return the number of prompt tokens of `sample` (what balances the ranks of a torchrun launch)."""
    return prepare(m, sample).seq_len


def token_counts(m: Loaded, sample: Sample, rule: str = "any") -> dict:
    """Return the prompt, visual and Omega tokens of one sample under model `m`'s processor."""
    prepared = prepare(m, sample)
    visual = prepared.layout.visual
    out = {"prompt_tokens": prepared.seq_len, "visual_tokens": int(len(visual))}
    if sample.targets:
        omega = prepared.layout.omega(sample.targets, rule, sample=sample.id)
        out["omega_tokens"] = int(len(omega))
        out["omega_share"] = len(omega) / len(visual) if len(visual) else None
    return out


def token_counter(path: str | Path, rule: str = "any") -> Callable[[Sample], dict]:
    """Return sample -> `token_counts` through the processor of checkpoint `path` (no weights loaded)."""
    m = processor_only(path)
    return lambda sample: token_counts(m, sample, rule)
