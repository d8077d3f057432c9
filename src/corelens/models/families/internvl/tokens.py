"""InternVL3 / 3.5 (`internvl`, the transformers-native checkpoints): tiles + thumbnail between `<img>` and
`</img>`, `image_seq_length` tokens per tile; video frames as one tile each.

The image processor (GOT-OCR2's), with the settings the processor applies (`crop_to_patches` is true by
default at the processor level, whatever the image processor stores), picks a grid of `cols x rows` tiles whose aspect ratio is closest to the
image's (between `min_patches` and `max_patches` tiles), squashes the image to `cols x rows` tiles of
`size` pixels and cuts them row-major; when there is more than one tile, a thumbnail of the whole image
follows. The model drops the CLS feature and pixel-shuffles each tile's `F x F` features into
`F/2 x F/2` tokens, row-major (each token = 2 x 2 patches), so every tile is a plain grid over its
rectangle of the original image. The `<img>` / `</img>` boundary tokens are not visual tokens.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

from corelens.errors import InputError
from corelens.layout import Layout, Segment
from corelens.models.effective import effective_images_kwargs


def _field(value, key: str):
    return value.get(key) if isinstance(value, dict) else getattr(value, key)


def tile_grid(image_size: tuple[int, int], processor) -> tuple[int, int, bool]:
    """Return the (cols, rows) tile grid the processor uses for an image, and whether a thumbnail follows.

    The settings are the processor's effective ones: `InternVLProcessor` tiles by default
    (`images_kwargs = {"crop_to_patches": True}`) whatever the GOT-OCR2 image processor stores (converted
    `-hf` checkpoints store false), so the image processor's attribute alone is not what runs.
    """
    settings = effective_images_kwargs(processor)
    if not settings.get("crop_to_patches"):
        return 1, 1, False
    width, height = image_size
    size = settings["size"]
    tile_h, tile_w = int(_field(size, "height")), int(_field(size, "width"))
    cols, rows = get_optimal_tiled_canvas(
        (height, width), (tile_h, tile_w), int(settings["min_patches"]), int(settings["max_patches"])
    )
    return cols, rows, cols * rows != 1


def _blocks(ids: np.ndarray, processor, sample: str | None) -> list[tuple[int, int]]:
    """Return the [start, end) spans of context tokens between each `<img>` and its `</img>`."""
    starts = np.flatnonzero(ids == processor.start_image_token_id)
    ends = np.flatnonzero(ids == processor.end_image_token_id)
    if len(starts) != len(ends) or np.any(ends <= starts):
        raise InputError("unbalanced <img> / </img> tokens in the prompt", sample=sample)
    spans = [(int(s) + 1, int(e)) for s, e in zip(starts, ends)]
    for s, e in spans:
        if not np.all(ids[s:e] == processor.image_token_id):
            raise InputError("an <img> block holds tokens other than image context tokens", sample=sample)
    return spans


def internvl_layout(
    input_ids: torch.Tensor,
    processor,
    image_sizes: list[tuple[int, int]],
    frame_size: tuple[int, int] | None = None,
    frame_times: list[float] | None = None,
    *,
    sample: str | None = None,
) -> Layout:
    """Return the layout of one InternVL prompt: one segment per tile and thumbnail, one per video frame."""
    ids = input_ids.reshape(-1).cpu().numpy()
    per_tile = int(processor.image_seq_length)
    side = math.isqrt(per_tile)
    blocks = _blocks(ids, processor, sample)
    frame_times = frame_times or []
    if len(blocks) != len(image_sizes) + len(frame_times):
        raise InputError(
            f"found {len(blocks)} <img> blocks for {len(image_sizes)} images and {len(frame_times)} frames",
            sample=sample,
        )
    segments: list[Segment] = []
    for i, ((start, end), size) in enumerate(zip(blocks, image_sizes)):
        cols, rows, thumbnail = tile_grid(tuple(size), processor)
        tiles = cols * rows + int(thumbnail)
        if end - start != tiles * per_tile:
            raise InputError(
                f"image {i}: {end - start} tokens, expected {tiles} tiles x {per_tile}", sample=sample
            )
        width, height = size
        for t in range(cols * rows):
            r, c = divmod(t, cols)
            region = (c * width / cols, r * height / rows, (c + 1) * width / cols, (r + 1) * height / rows)
            view = "full" if tiles == 1 else f"tile {r},{c}"
            segments.append(
                Segment("image", i, start + t * per_tile, side, side, tuple(size), view=view, region=region)
            )
        if thumbnail:
            segments.append(
                Segment("image", i, start + cols * rows * per_tile, side, side, tuple(size), view="thumbnail")
            )
    step = frame_times[1] - frame_times[0] if len(frame_times) > 1 else 1.0
    for f, ((start, end), t) in enumerate(zip(blocks[len(image_sizes) :], frame_times)):
        if end - start != per_tile:
            raise InputError(f"video frame {f}: {end - start} tokens, expected {per_tile}", sample=sample)
        segments.append(
            Segment(
                "video",
                0,
                start,
                side,
                side,
                tuple(frame_size or (0, 0)),
                frames=(f,),
                time_span=(t, t + step),
            )
        )
    return Layout(tuple(segments), int(len(ids)))
