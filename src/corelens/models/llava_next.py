"""LLaVA-NeXT (`llava_next`): a base view of the whole image, then an any-res grid of tiles, unpadded, with
a newline token ending every row.

The image processor picks the best resolution among `image_grid_pinpoints`, resizes the image into it
keeping the aspect ratio, pads it to that resolution (centred) and cuts it into square tiles of the vision
tower's input size; the base view is the whole image squashed to one tile. The model (`pack_image_features`)
emits per image: the base view's `h x w` features, then the tiles' features stitched into one grid from
which `unpad_image` removes the rows (or columns) that show only padding, each row followed by the learned
`image_newline` token. Both views become segments here: `base` (the whole image) and `grid` (the unpadded
area, `row_newline=True`), so a box maps to tokens in both.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from transformers.image_processing_utils import select_best_resolution

from corelens.errors import InputError, UnsupportedModelError
from corelens.layout import Layout, Segment


def _fit(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """Return the (height, width) of an image of `size` (h, w) resized into `target` keeping its aspect."""
    height, width = size
    target_h, target_w = target
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def _unpad(features_h: int, features_w: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Return the kept feature rows [r0, r1) and columns [c0, c1) after `unpad_image` (transformers' rule)."""
    height, width = size
    if width / height > features_w / features_h:
        new_h = int(round(height * (features_w / width), 7))
        pad = (features_h - new_h) // 2
        return pad, features_h - pad, 0, features_w
    new_w = int(round(width * (features_h / height), 7))
    pad = (features_w - new_w) // 2
    return 0, features_h, pad, features_w - pad


def anyres_grid(
    image_size: tuple[int, int], processor, tile: int, per_tile: int
) -> tuple[int, int, tuple[float, float, float, float]]:
    """Return the rows, columns and original-pixel region of an image's unpadded any-res feature grid.

    `tile` is the vision tower's input side in pixels, `per_tile` its features per side.
    """
    width, height = image_size
    patch = tile / per_tile  # canvas pixels per feature
    best_h, best_w = select_best_resolution((height, width), processor.image_processor.image_grid_pinpoints)
    new_h, new_w = _fit((height, width), (best_h, best_w))
    paste_x, paste_y = (best_w - new_w) // 2, (best_h - new_h) // 2
    features_h, features_w = (best_h // tile) * per_tile, (best_w // tile) * per_tile
    r0, r1, c0, c1 = _unpad(features_h, features_w, (height, width))
    sx, sy = new_w / width, new_h / height  # canvas pixels per original pixel
    region = (
        (c0 * patch - paste_x) / sx,
        (r0 * patch - paste_y) / sy,
        (c1 * patch - paste_x) / sx,
        (r1 * patch - paste_y) / sy,
    )
    return r1 - r0, c1 - c0, region


def next_segments(
    image_size: tuple[int, int], processor, tile: int, source: int, start: int
) -> tuple[Segment, Segment]:
    """Return the base-view and grid segments of one image whose tokens start at `start`."""
    per_tile = tile // int(processor.patch_size)
    rows, cols, region = anyres_grid(image_size, processor, tile, per_tile)
    base = Segment("image", source, start, per_tile, per_tile, tuple(image_size), view="base")
    grid = Segment(
        "image", source, base.end, rows, cols, tuple(image_size), view="grid", row_newline=True, region=region
    )
    return base, grid


def take_run(positions: np.ndarray, used: int, count: int, what: str, sample: str | None) -> int:
    """Return the first position of the next `count` visual tokens, which must form one contiguous run."""
    span = positions[used : used + count]
    if len(span) != count or span[-1] - span[0] != count - 1:
        raise InputError(f"{what}: expected one run of {count} visual tokens in the prompt", sample=sample)
    return int(span[0])


def llava_next_layout(
    input_ids: torch.Tensor,
    processor,
    tile: int,
    image_sizes: list[tuple[int, int]],
    *,
    sample: str | None = None,
) -> Layout:
    """Return the layout of one LLaVA-NeXT prompt: a base-view and a grid segment per image."""
    ip = processor.image_processor
    crop = getattr(ip, "crop_size", None) or {}
    crop_side = crop.get("height") if isinstance(crop, dict) else getattr(crop, "height", None)
    if crop_side not in (None, tile):
        raise UnsupportedModelError(f"LLaVA-NeXT crop size {crop_side} differs from the vision tile {tile}")
    if processor.vision_feature_select_strategy != "default":
        raise UnsupportedModelError("LLaVA-NeXT layouts need vision_feature_select_strategy='default'")
    ids = input_ids.reshape(-1).cpu().numpy()
    positions = np.flatnonzero(ids == processor.image_token_id)
    segments, used = [], 0
    for i, size in enumerate(image_sizes):
        first = int(positions[used]) if used < len(positions) else 0
        base, grid = next_segments(tuple(size), processor, tile, i, first)
        take_run(
            positions,
            used,
            grid.end - base.start,
            f"image {i} (base view + unpadded grid + newlines)",
            sample,
        )
        segments += [base, grid]
        used += grid.end - base.start
    if used != len(positions):
        raise InputError(
            f"{len(positions) - used} image tokens are left over after the images", sample=sample
        )
    return Layout(tuple(segments), int(len(ids)))
