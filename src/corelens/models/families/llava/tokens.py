"""LLaVA-1.5 (`llava`): one fixed grid of visual tokens per image, after padding, resizing and centre cropping.

The image processor (CLIP's recipe, `LlavaImageProcessor`) optionally pads the image to a square (LLaVA-1.5's
"pad" aspect mode), resizes it (shortest edge to `size`, or to a fixed height x width) and crops the centre
(`crop_size`); the vision tower cuts the crop into `patch_size` patches, and the processor expands each
`<image>` into one token per patch (the CLS feature is dropped under the "default" feature strategy). So
each image is one run of `rows x cols` tokens in row-major order over a rectangle of the original image:
smaller than the image when the crop cuts its sides, larger when padding added borders.
"""

from __future__ import annotations

import numpy as np
import torch

from corelens.errors import InputError, UnsupportedModelError
from corelens.layout import Layout, Segment
from corelens.models.effective import effective_images_kwargs


def _get(config, key: str):
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _resized(width: int, height: int, size) -> tuple[int, int]:
    """Return (width, height) after the processor's resize (transformers' rules, integer truncation)."""
    if _get(size, "height") and _get(size, "width"):
        return int(_get(size, "width")), int(_get(size, "height"))
    short_edge = _get(size, "shortest_edge")
    if not short_edge:
        raise UnsupportedModelError(
            f"image processor size {size!r}: expected shortest_edge or height + width"
        )
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(short_edge * long / short)
    return (short_edge, new_long) if width <= height else (new_long, short_edge)


def grid_region(
    image_size: tuple[int, int], ip, patch: int | None = None
) -> tuple[tuple[float, float, float, float], tuple[int, int]]:
    """Return the original-pixel rectangle the patch grid covers and the processed (width, height).

    `ip` is the image processor or a dict of the settings the processor applies (`effective_images_kwargs`).
    With `patch`, the rectangle stops at the last whole patch (a crop that `patch` does not divide leaves its
    last pixels unseen); without it, it is the whole processed image.
    """
    if not isinstance(ip, dict):
        ip = {k: getattr(ip, k, None) for k in ("do_pad", "do_resize", "size", "do_center_crop", "crop_size")}
    width, height = image_size
    x0, y0, frame_w, frame_h = 0.0, 0.0, float(width), float(height)
    if ip.get("do_pad"):
        side = max(width, height)
        x0, y0 = -float((side - width) // 2), -float((side - height) // 2)
        frame_w = frame_h = float(side)
    w, h = (int(frame_w), int(frame_h))
    if ip.get("do_resize", True) is not False:
        w, h = _resized(w, h, ip["size"])
    sx, sy = frame_w / w, frame_h / h  # original pixels per processed pixel
    left = top = 0.0
    if ip.get("do_center_crop"):
        crop_w, crop_h = int(_get(ip["crop_size"], "width")), int(_get(ip["crop_size"], "height"))
        # Crops larger than the image pad it first (transformers' centre crop), by (crop - size) // 2.
        left = -float((crop_w - w) // 2) if crop_w > w else float(int((w - crop_w) / 2.0))
        top = -float((crop_h - h) // 2) if crop_h > h else float(int((h - crop_h) / 2.0))
        w, h = crop_w, crop_h
    seen_w, seen_h = (w // patch * patch, h // patch * patch) if patch else (w, h)
    region = (x0 + left * sx, y0 + top * sy, x0 + (left + seen_w) * sx, y0 + (top + seen_h) * sy)
    return region, (w, h)


def llava_layout(
    input_ids: torch.Tensor,
    processor,
    image_sizes: list[tuple[int, int]],
    *,
    patch: int | None = None,
    sample: str | None = None,
) -> Layout:
    """Return the layout of one LLaVA-1.5 prompt: one `rows x cols` segment per image.

    `patch` is the vision tower's patch size (default: the processor's, which counts the tokens).
    """
    ids = input_ids.reshape(-1).cpu().numpy()
    positions = np.flatnonzero(ids == processor.image_token_id)
    patch = int(patch or processor.patch_size)
    settings = effective_images_kwargs(processor)
    segments, used = [], 0
    # Images are consumed in order, rows x cols tokens each (adjacent images may form one run of tokens).
    for i, size in enumerate(image_sizes):
        region, (w, h) = grid_region(size, settings, patch)
        rows, cols = h // patch, w // patch
        span = positions[used : used + rows * cols]
        if len(span) != rows * cols or span[-1] - span[0] != rows * cols - 1:
            raise InputError(
                f"image {i}: expected a run of {rows} x {cols} image tokens for its {w}x{h} crop; the prompt "
                f"has {len(positions)} image tokens for {len(image_sizes)} images",
                sample=sample,
            )
        segments.append(Segment("image", i, int(span[0]), rows, cols, tuple(size), region=region))
        used += rows * cols
    if used != len(positions):
        raise InputError(
            f"{len(positions) - used} image tokens are left over after {len(image_sizes)} images",
            sample=sample,
        )
    return Layout(tuple(segments), int(len(ids)))
