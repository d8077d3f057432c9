"""Fast training batches: rendered samples -> the tensors Qwen2.5-VL's processor would produce.

The processor handles one image at a time and costs about as much as a training step on two cores, so
training builds the same tensors directly: the organism's images are already multiples of 28 pixels
within the pixel budget (no resize), and the prompt is the chat template's token sequence. A test checks
that `encode` equals the processor's output; evaluation always goes through the processor itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from corelens.organism.tasks import Rendered

IGNORE = -100


def patchify(frames: Sequence[Image.Image], processor) -> tuple[torch.Tensor, list[int]]:
    """Return the flattened patches and (t, h, w) grid of one image (1 frame) or one video (>1 frames)."""
    ip = processor.image_processor
    patch, merge, temporal = ip.patch_size, ip.merge_size, ip.temporal_patch_size
    x = torch.from_numpy(np.stack([np.asarray(f, dtype=np.uint8) for f in frames])).permute(0, 3, 1, 2)
    x = x.to(torch.float32)
    mean = torch.tensor(ip.image_mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    std = torch.tensor(ip.image_std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    x = (x - mean) / std
    if x.shape[0] % temporal:
        x = torch.cat([x, x[-1:].expand(temporal - x.shape[0] % temporal, -1, -1, -1)])
    t, c, height, width = x.shape
    gt, gh, gw = t // temporal, height // patch, width // patch
    if gh * patch != height or gw * patch != width or gh % merge or gw % merge:
        raise ValueError(f"image size {width}x{height} is not a multiple of {patch * merge} pixels")
    x = x.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * temporal * patch * patch), [gt, gh, gw]


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode(
    processor,
    samples: Sequence[Rendered],
    *,
    answers: bool = True,
    extra: Sequence[Sequence[tuple[str, str]]] = (),
) -> dict[str, torch.Tensor]:
    """Return a left-padded batch (input_ids, attention_mask, pixels, grids, labels) of rendered samples.

    With `answers`, each sample's own question is followed by its answer and `<|im_end|>`, then by the
    (question, answer) turns of `extra[i]` if given; only answers and their `<|im_end|>` carry labels
    (everything else is -100). `answer_at` / `answer_len` hold the position and length (tokens) of each sample's own answer.
    """
    tok = processor.tokenizer
    merge = processor.image_processor.merge_size
    special = {name: tok.convert_tokens_to_ids(name) for name in tok.all_special_tokens}
    head = _ids(tok, "<|im_start|>user")
    tail = [special["<|im_end|>"], *_ids(tok, "<|im_start|>assistant")]
    rows, labels, starts, lengths = [], [], [], []
    image_pixels, image_grids, video_pixels, video_grids, seconds = [], [], [], [], []
    for sample in samples:
        ids = list(head)
        for image in sample.images:
            pixels, grid = patchify([image], processor)
            image_pixels.append(pixels)
            image_grids.append(grid)
            ids += [special["<|vision_start|>"]] + [special["<|image_pad|>"]] * (len(pixels) // merge**2)
            ids += [special["<|vision_end|>"]]
        if sample.frames:
            pixels, grid = patchify(sample.frames, processor)
            video_pixels.append(pixels)
            video_grids.append(grid)
            fps = float(sample.record["video"]["fps"])
            seconds.append(processor.video_processor.temporal_patch_size / fps)
            ids += [special["<|vision_start|>"]] + [special["<|video_pad|>"]] * (len(pixels) // merge**2)
            ids += [special["<|vision_end|>"]]
        ids += _ids(tok, sample.record["question"]) + tail
        label = [IGNORE] * len(ids)
        starts.append(len(ids))
        lengths.append(len(_ids(tok, sample.record["answer"])))
        if answers:
            turns = [(None, sample.record["answer"]), *(extra[len(rows)] if extra else ())]
            for question, answer in turns:
                if question is not None:
                    turn = [*head, *_ids(tok, question), *tail]
                    ids += turn
                    label += [IGNORE] * len(turn)
                reply = _ids(tok, answer) + [special["<|im_end|>"]]
                ids += reply
                label += reply
        rows.append(ids)
        labels.append(label)
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id
    batch = {
        "input_ids": torch.tensor([[pad] * (width - len(r)) + r for r in rows]),
        "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows]),
        "labels": torch.tensor([[IGNORE] * (width - len(r)) + lab for r, lab in zip(rows, labels)]),
    }
    batch["answer_at"] = torch.tensor([width - len(r) + s for r, s in zip(rows, starts)])
    batch["answer_len"] = torch.tensor(lengths)
    # Qwen2.5-VL builds its 3-D (t, h, w) rope positions from these: 1 = image token, 2 = video token.
    ids = batch["input_ids"]
    batch["mm_token_type_ids"] = (ids == special["<|image_pad|>"]).long() + 2 * (
        ids == special["<|video_pad|>"]
    ).long()
    if image_pixels:
        batch["pixel_values"] = torch.cat(image_pixels)
        batch["image_grid_thw"] = torch.tensor(image_grids)
    if video_pixels:
        batch["pixel_values_videos"] = torch.cat(video_pixels)
        batch["video_grid_thw"] = torch.tensor(video_grids)
        batch["second_per_grid_ts"] = torch.tensor(seconds)
    return batch
