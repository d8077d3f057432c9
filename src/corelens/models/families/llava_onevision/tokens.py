"""LLaVA-OneVision (`llava_onevision`): LLaVA-NeXT's any-res layout with downsampling, multi-image and video.

- One image in the prompt: the base view (`h x w` SigLIP features, no CLS), then the unpadded any-res grid
  with a newline ending every row; when that grid holds more than `anyres_max_N` tiles' worth of features
  (ratio > 1.1) the model resizes it bilinearly to `int(rows // ratio) x int(cols // ratio)`, over the same
  region of the image.

Geometry: SigLIP-so400m-patch14-384 cuts each 384-pixel tile into 27 patches of 14 pixels (378 pixels), so
cells are spaced at the patch size and the last 6 pixels of every tile reach no token (`feature_spans`).
Where the model resizes features bilinearly (the downsampled grid, video pooling), a cell spans the
footprint of the features it interpolates (`bilinear_footprint`), so Omega holds exactly the tokens whose
input changes when the pixels of a box change (checked against the stock model in
`tests/test_omega_oracle.py`).
- Several images in one prompt: each is padded to a square (centred) and squashed to one tile: `h x w`
  features then one newline token.
- Video: every frame is squashed to one tile, its `h x w` features pooled bilinearly to `ceil(h/2) x
  ceil(w/2)`; the frames follow each other and one newline token ends the video.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from corelens.errors import InputError, UnsupportedModelError
from corelens.layout import Layout, Segment
from corelens.models.families.llava_next.tokens import (
    anyres_grid,
    bilinear_footprint,
    feature_spans,
    squashed_spans,
    take_run,
    to_original,
)


def _max_tiles(processor) -> int:
    aspect = str(getattr(processor, "vision_aspect_ratio", "anyres_max_9"))
    if not aspect.startswith("anyres_max_"):
        raise UnsupportedModelError(f"LLaVA-OneVision vision_aspect_ratio {aspect!r}: expected anyres_max_N")
    return int(aspect[len("anyres_max_") :])


def _per_tile(processor, tile: int, patch: int) -> int:
    per_tile = tile // patch
    if per_tile * per_tile != int(processor.num_image_tokens):
        raise UnsupportedModelError(
            f"LLaVA-OneVision: the vision tower gives {per_tile} x {per_tile} features per {tile}-pixel tile "
            f"({patch}-pixel patches), the processor counts num_image_tokens = {processor.num_image_tokens}"
        )
    return per_tile


def _image_segments(
    size: tuple[int, int], processor, tile: int, patch: int, source: int, start: int, single: bool
) -> list[Segment]:
    per_tile = _per_tile(processor, tile, patch)
    width, height = size
    if not single:  # padded to a square, squashed to one tile, one newline
        side = max(width, height)
        x0, y0 = float((side - width) // 2), float((side - height) // 2)
        spans = feature_spans(1, tile, patch)
        region = (-x0, -y0, side - x0, side - y0)
        return [
            Segment(
                "image",
                source,
                start,
                per_tile,
                per_tile,
                size,
                region=region,
                trailing=1,
                col_spans=to_original(spans, x0 * tile / side, side / tile),
                row_spans=to_original(spans, y0 * tile / side, side / tile),
            )
        ]
    bx, by = squashed_spans(size, tile, patch)
    base = Segment("image", source, start, per_tile, per_tile, size, view="base", col_spans=bx, row_spans=by)
    xs, ys, region = anyres_grid(size, processor, tile, patch)
    rows, cols = len(ys), len(xs)
    ratio = math.sqrt(rows * cols / (_max_tiles(processor) * per_tile**2))
    if ratio > 1.1:  # the model resizes the unpadded grid bilinearly (pack_image_features)
        rows, cols = int(rows // ratio), int(cols // ratio)
        xs, ys = bilinear_footprint(xs, cols), bilinear_footprint(ys, rows)
    grid = Segment(
        "image",
        source,
        base.end,
        rows,
        cols,
        size,
        view="grid",
        row_newline=True,
        region=region,
        col_spans=tuple(map(tuple, xs)),
        row_spans=tuple(map(tuple, ys)),
    )
    return [base, grid]


def onevision_layout(
    input_ids: torch.Tensor,
    processor,
    tile: int,
    image_sizes: list[tuple[int, int]],
    frame_size: tuple[int, int] | None = None,
    frame_times: list[float] | None = None,
    *,
    patch: int = 14,
    sample: str | None = None,
) -> Layout:
    """Return the layout of one LLaVA-OneVision prompt (images first, then the video, as corelens prompts).

    `tile` and `patch` are the vision tower's image and patch size (`vision_config.image_size`, `.patch_size`).
    """
    if processor.vision_feature_select_strategy != "full":
        raise UnsupportedModelError("LLaVA-OneVision layouts need vision_feature_select_strategy='full'")
    ids = input_ids.reshape(-1).cpu().numpy()
    positions = np.flatnonzero(ids == processor.image_token_id)
    segments: list[Segment] = []
    used = 0
    for i, size in enumerate(image_sizes):
        first = int(positions[used]) if used < len(positions) else 0
        parts = _image_segments(tuple(size), processor, tile, patch, i, first, single=len(image_sizes) == 1)
        count = parts[-1].end - parts[0].start
        take_run(positions, used, count, f"image {i}", sample)
        segments += parts
        used += count
    if used != len(positions):
        raise InputError(
            f"{len(positions) - used} image tokens are left over after the images", sample=sample
        )
    if frame_times:
        video = np.flatnonzero(ids == processor.video_token_id)
        per_tile = _per_tile(processor, tile, patch)
        pooled = math.ceil(per_tile / 2)
        count = len(frame_times) * pooled * pooled + 1
        start = take_run(video, 0, count, "video", sample)
        if len(video) != count:
            raise InputError(f"the video has {len(video)} tokens, expected {count}", sample=sample)
        fw, fh = frame_size or (0, 0)
        spans = bilinear_footprint(
            feature_spans(1, tile, patch), pooled
        )  # apply_pooling: bilinear to ceil(h/2)
        xs, ys = to_original(spans, 0.0, fw / tile), to_original(spans, 0.0, fh / tile)
        step = frame_times[1] - frame_times[0] if len(frame_times) > 1 else 1.0
        for f, t in enumerate(frame_times):
            segments.append(
                Segment(
                    "video",
                    0,
                    start + f * pooled * pooled,
                    pooled,
                    pooled,
                    tuple(frame_size or (0, 0)),
                    frames=(f,),
                    time_span=(t, t + step),
                    trailing=int(f == len(frame_times) - 1),
                    col_spans=xs,
                    row_spans=ys,
                )
            )
    return Layout(tuple(segments), int(len(ids)))
