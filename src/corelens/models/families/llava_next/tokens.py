"""LLaVA-NeXT (`llava_next`): a base view of the whole image, then an any-res grid of tiles, unpadded, with
a newline token ending every row.

The image processor picks the best resolution among `image_grid_pinpoints`, resizes the image into it
keeping the aspect ratio, pads it to that resolution (centred) and cuts it into square tiles of the vision
tower's input size; the base view is the whole image squashed to one tile. The model (`pack_image_features`)
emits per image: the base view's `h x w` features, then the tiles' features stitched into one grid from
which `unpad_image` removes the rows (or columns) that show only padding, each row followed by the learned
`image_newline` token. Both views become segments here: `base` (the whole image) and `grid` (the unpadded
area, `row_newline=True`), so a box maps to tokens in both. Cells are placed at the vision tower's patch
size (`feature_spans`), and the pinpoints are the ones the processor applies (`effective_images_kwargs`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from transformers.image_processing_utils import select_best_resolution

from corelens.errors import InputError, UnsupportedModelError
from corelens.layout import Layout, Segment
from corelens.models.effective import effective_images_kwargs


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


def feature_spans(tiles: int, tile: int, patch: int) -> np.ndarray:
    """Return the canvas-pixel span (x0, x1) of every feature along `tiles` tiles of `tile` pixels.

    The vision tower cuts each tile into `tile // patch` patches of `patch` pixels from its top-left corner;
    when `patch` does not divide `tile` (SigLIP-so400m: 27 x 14 = 378 of 384 pixels), the tile's last
    `tile % patch` pixels reach no feature, so features are spaced at the patch size, not at tile / count.
    """
    per_tile = tile // patch
    f = np.arange(tiles * per_tile)
    start = (f // per_tile) * tile + (f % per_tile) * patch
    return np.stack([start, start + patch], axis=1).astype(np.float64)


def bilinear_footprint(spans: np.ndarray, n_out: int) -> np.ndarray:
    """Return the spans of `n_out` outputs of a bilinear resize (align_corners=False) of features at `spans`.

    Output j interpolates input features floor(s) and floor(s) + 1, s = (j + 0.5) * n_in / n_out - 0.5
    (clamped at 0; the second feature only where its weight is non-zero): PyTorch's rule, used by
    LLaVA-OneVision's grid downsampling and video pooling. Its span runs from the first feature's start to
    the last one's end, so neighbouring outputs may overlap: any pixel that changes an output is inside it.
    """
    n_in = len(spans)
    scale = n_in / n_out
    out = np.empty((n_out, 2))
    for j in range(n_out):
        src = max((j + 0.5) * scale - 0.5, 0.0)
        i0 = min(int(np.floor(src)), n_in - 1)
        i1 = i0 + 1 if i0 < n_in - 1 and src - i0 > 1e-6 else i0
        out[j] = spans[i0, 0], spans[i1, 1]
    return out


def to_original(spans: np.ndarray, offset: float, scale: float) -> tuple[tuple[float, float], ...]:
    """Map processed-pixel spans to original pixels: x_orig = (x - offset) * scale."""
    return tuple((float((a - offset) * scale), float((b - offset) * scale)) for a, b in spans)


def squashed_spans(size: tuple[int, int], tile: int, patch: int) -> tuple[tuple, tuple]:
    """Return the column and row spans of an image squashed to one `tile` x `tile` view."""
    width, height = size
    spans = feature_spans(1, tile, patch)
    return to_original(spans, 0.0, width / tile), to_original(spans, 0.0, height / tile)


def anyres_grid(
    image_size: tuple[int, int], processor, tile: int, patch: int
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float]]:
    """Return the column and row spans (canvas features kept by `unpad_image`, in original pixels) and region.

    `tile` is the vision tower's input side in pixels, `patch` its patch size. The region is the rectangle
    from the first kept feature's start to the last one's end.
    """
    width, height = image_size
    per_tile = tile // patch
    pinpoints = effective_images_kwargs(processor).get("image_grid_pinpoints")
    best_h, best_w = select_best_resolution((height, width), pinpoints)
    new_h, new_w = _fit((height, width), (best_h, best_w))
    paste_x, paste_y = (best_w - new_w) // 2, (best_h - new_h) // 2
    features_h, features_w = (best_h // tile) * per_tile, (best_w // tile) * per_tile
    r0, r1, c0, c1 = _unpad(features_h, features_w, (height, width))
    xs = np.asarray(to_original(feature_spans(best_w // tile, tile, patch)[c0:c1], paste_x, width / new_w))
    ys = np.asarray(to_original(feature_spans(best_h // tile, tile, patch)[r0:r1], paste_y, height / new_h))
    region = (float(xs[0, 0]), float(ys[0, 0]), float(xs[-1, 1]), float(ys[-1, 1]))
    return xs, ys, region


def next_segments(
    image_size: tuple[int, int], processor, tile: int, patch: int, source: int, start: int
) -> tuple[Segment, Segment]:
    """Return the base-view and grid segments of one image whose tokens start at `start`."""
    per_tile = tile // patch
    xs, ys, region = anyres_grid(image_size, processor, tile, patch)
    bx, by = squashed_spans(tuple(image_size), tile, patch)
    base = Segment(
        "image", source, start, per_tile, per_tile, tuple(image_size), view="base", col_spans=bx, row_spans=by
    )
    grid = Segment(
        "image",
        source,
        base.end,
        len(ys),
        len(xs),
        tuple(image_size),
        view="grid",
        row_newline=True,
        region=region,
        col_spans=tuple(map(tuple, xs)),
        row_spans=tuple(map(tuple, ys)),
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
    patch: int | None = None,
    sample: str | None = None,
) -> Layout:
    """Return the layout of one LLaVA-NeXT prompt: a base-view and a grid segment per image.

    `tile` and `patch` are the vision tower's image and patch size (`patch` defaults to the processor's).
    """
    patch = int(patch or processor.patch_size)
    crop = effective_images_kwargs(processor).get("crop_size") or {}
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
        base, grid = next_segments(tuple(size), processor, tile, patch, i, first)
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
