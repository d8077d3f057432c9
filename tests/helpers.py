"""Test helpers: images that encode their own pixel positions, random images, and a toy registered policy."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image

from corelens.models.families import FAMILIES


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


# Released checkpoints whose published processor files and vision geometry are kept in tests/data/configs
# (where each came from: tests/data/configs/SOURCES.md): each registered family's `released`.
CONFIGS = Path(__file__).parent / "data" / "configs"
RELEASED = {name: FAMILIES[name].released for name in FAMILIES if FAMILIES[name].released}


@functools.cache
def released_processor(family: str):
    """Return `family`'s processor built from its released checkpoint's published files (tiny tokenizer)."""
    from corelens.models.tiny import released_processor as build
    from corelens.models.tiny import tiny_tokenizer

    return build(CONFIGS / RELEASED[family], tiny_tokenizer(family, ["cup", "red", "blue"]))


def released_geometry(family: str) -> dict:
    """Return the released checkpoint's vision geometry (`config.json`: vision_config + top-level fields)."""
    config = json.loads((CONFIGS / RELEASED[family] / "config.json").read_text())
    vision = config["vision_config"]
    size, patch = vision.get("image_size"), vision["patch_size"]
    size = size[0] if isinstance(size, list) else size
    patch = patch[0] if isinstance(patch, list) else patch
    return {"tile": size, "patch": patch}


def register_toy_policy(monkeypatch) -> str:
    """Register, for one test, a zero ablation under a name no integration knows; return that name."""
    from corelens.policies import HeadsPolicy, PolicyInterface, register
    from corelens.policies.zero import ZeroHook

    monkeypatch.setattr(PolicyInterface, "_global_mapping", dict(PolicyInterface._global_mapping))

    @register
    @dataclass(frozen=True)
    class Silence(HeadsPolicy):
        name: ClassVar[str] = "silence-test"

        def hooks(self, model, context):
            return [ZeroHook(self.by_layer(model))]

    return Silence.name


@contextmanager
def hybrid(m, full, **options) -> Iterator:
    """Apply `HybridAttention(full, **options)` (sink, window, kernel, decode, dense_below) to `m` inside the
    block, with no prompt context (the hybrid pattern needs none); the block's value is the policy's session
    (`stats`, `cache()`, `cache_report()`, `hook`)."""
    from corelens.policies import HybridAttention

    with HybridAttention(tuple(tuple(p) for p in full), **options).applied(m) as on:
        yield on.hooks[0].session
