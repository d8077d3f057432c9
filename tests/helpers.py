"""Test helpers: images that encode their own pixel positions, and random images."""

from __future__ import annotations

import numpy as np
from PIL import Image


def position_image(width: int, height: int, frame: float = 0.0) -> Image.Image:
    """Return an image whose red / green encode x / y (linear ramps) and blue a frame code in [0, 1]."""
    x = (np.arange(width) + 0.5) / width
    y = (np.arange(height) + 0.5) / height
    rgb = np.empty((height, width, 3), dtype=np.float64)
    rgb[..., 0] = x[None, :]
    rgb[..., 1] = y[:, None]
    rgb[..., 2] = frame
    return Image.fromarray(np.round(rgb * 255).astype(np.uint8))


def noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    """Return a random RGB image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
