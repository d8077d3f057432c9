"""Auxiliary training signal for the vision tower: what lies under each visual token (training only).

The answer loss gives one label per question; the vision tower learns faster with a dense one. Small
linear heads read each merged visual token (the features the decoder receives) and predict, from the
scene's ground truth, the colour and shape of the object covering that token's 28 x 28 cell ("none" when
no object does), its size (image), its motion (video) and whether the cell belongs to the marked block
(document). The heads are not part of the model: they are dropped when the checkpoint is saved, and they
never see the decoder, whose attention (what RAM measures) is shaped by the answer loss alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from corelens.organism.tasks import COLOURS, MOTIONS, SHAPES, SIZES, Rendered

CELL = 28
MIN_OVERLAP = 20  # pixels of an object inside a cell for the cell to count as showing it
HEADS = {"colour": COLOURS, "shape": SHAPES, "size": SIZES, "motion": MOTIONS, "marked": ("marked",)}
IGNORE = -100


def _grid(size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    width, height = size
    return np.arange(0, width, CELL), np.arange(0, height, CELL)


def _overlap(box: Sequence[int], xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    ox = np.clip(np.minimum(xs + CELL, box[2]) - np.maximum(xs, box[0]), 0, None)
    oy = np.clip(np.minimum(ys + CELL, box[3]) - np.maximum(ys, box[1]), 0, None)
    return oy[:, None] * ox[None, :]


def _cells(size: tuple[int, int], objects: list[tuple[list[Sequence[int]], dict]]) -> dict[str, np.ndarray]:
    """Label each cell with the attributes of the object covering most of it (index, or len = none)."""
    xs, ys = _grid(size)
    best = np.full((len(ys), len(xs)), MIN_OVERLAP - 1)
    labels = {k: np.full((len(ys), len(xs)), len(v)) for k, v in HEADS.items() if k != "marked"}
    for boxes, attrs in objects:
        area = np.max([_overlap(b, xs, ys) for b in boxes], axis=0)
        win = area > best
        best = np.where(win, area, best)
        for key, values in HEADS.items():
            if key in labels:
                value = values.index(attrs[key]) if key in attrs else IGNORE
                labels[key] = np.where(win, value, labels[key])
    for key in labels:
        if not any(key in attrs for _, attrs in objects):
            labels[key][:] = IGNORE
    return labels


def sample_labels(sample: Rendered) -> list[dict[str, np.ndarray]]:
    """Return per-token labels for each visual segment of `sample` (images, or video frame groups)."""
    record = sample.record
    scene = record["scene"]
    if record["task"] == "image":
        objects = [([o["box"]], o) for o in scene["objects"]]
        return [_cells(sample.images[0].size, objects)]
    if record["task"] == "video":
        frames = len(sample.frames)
        out = []
        for g in range((frames + 1) // 2):
            group = [min(2 * g + k, frames - 1) for k in range(2)]
            objects = [([o["boxes"][f] for f in group], o) for o in scene["objects"]]
            out.append(_cells(sample.frames[0].size, objects))
        return out
    out = []
    for p, blocks in enumerate(scene["pages"]):
        figures = [([b["figure"]["box"]], b["figure"]) for b in blocks if b["kind"] == "figure"]
        labels = _cells(sample.images[p].size, figures)
        xs, ys = _grid(sample.images[p].size)
        marked = np.ones((len(ys), len(xs)), dtype=np.int64)  # 1 = none, 0 = the word "marked"
        for b in blocks:
            if b["marked"]:
                marked = np.where(_overlap(b["box"], xs, ys) >= MIN_OVERLAP, 0, 1)
        labels["marked"] = marked
        out.append(labels)
    return out


def batch_labels(samples: Sequence[Rendered]) -> dict[str, torch.Tensor]:
    """Return each head's labels for all visual tokens of a batch, in the vision tower's output order."""
    segments = [seg for s in samples for seg in sample_labels(s)]
    return {
        key: torch.from_numpy(np.concatenate([seg[key].reshape(-1) for seg in segments])).long()
        for key in HEADS
        if all(key in seg for seg in segments)
    }


class AuxHeads(torch.nn.Module):
    """Read-outs of the merged visual tokens, one per attribute, scored against the words' embeddings.

    The logit of a word is the token's dot product with that word's (tied) input embedding, so a visual
    token showing a red circle comes to point along the embeddings of "red" and "circle": the words the
    questions use. A learned vector scores the extra "none" class.
    """

    def __init__(self, embeddings: torch.nn.Embedding, tokenizer) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.ids = {k: tokenizer.convert_tokens_to_ids(list(v)) for k, v in HEADS.items()}
        hidden = embeddings.weight.shape[1]
        self.none = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.zeros(hidden)) for k in HEADS})
        self.bias = torch.nn.ParameterDict(
            {k: torch.nn.Parameter(torch.zeros(len(v) + 1)) for k, v in HEADS.items()}
        )
        self.scale = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.tensor(4.0)) for k in HEADS})

    def logits(self, key: str, features: torch.Tensor) -> torch.Tensor:
        """Return (tokens, words + 1) logits of head `key`; the last class is "none"."""
        words = self.embeddings.weight[self.ids[key]]
        table = torch.cat([words, self.none[key][None]])
        return self.scale[key] * features @ table.T + self.bias[key]

    def loss(self, features: torch.Tensor, labels: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return the summed cross-entropy of every head that has labels in this batch."""
        total = features.new_zeros(())
        for key, target in labels.items():
            if (target != IGNORE).any():
                logits = self.logits(key, features)
                total = total + torch.nn.functional.cross_entropy(logits, target, ignore_index=IGNORE)
        return total
