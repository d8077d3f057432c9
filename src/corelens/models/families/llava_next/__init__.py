"""LLaVA-NeXT (`llava_next`): a base view and an any-res grid per image (layout: `corelens.models.families.llava_next.tokens`)."""

from __future__ import annotations

import transformers

from corelens.models.families.family import register
from corelens.models.families.llava import (
    LLAVA,
    TINY_PINPOINTS,
    TOWER_GEOMETRY,
    clip_tower,
    crop_recipe,
    llava_tiny_config,
    llava_tiny_processor,
    tower,
)
from corelens.models.families.llava_next.tokens import llava_next_layout


def layout(m, inputs, images: list, frames: list, times: list[float], sample: str | None):
    """Return the layout of one LLaVA-NeXT prompt (`llava_next_layout`)."""
    tile, patch = tower(m)
    sizes = [im.size for im in images]
    return llava_next_layout(inputs["input_ids"], m.processor, tile, sizes, patch=patch, sample=sample)


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny LLaVA-NeXT config (any-res pinpoints scaled to 56-pixel tiles)."""
    return llava_tiny_config(
        "llava_next", tokenizer, clip_tower(vision_depth), sizes, image_grid_pinpoints=TINY_PINPOINTS
    )


def tiny_processor(tokenizer, *, side: int = 56):
    """Return LLaVA-NeXT's processor (CLIP's crop recipe, the tiny pinpoints)."""
    image_processor = transformers.LlavaNextImageProcessor(
        **crop_recipe(side), image_grid_pinpoints=TINY_PINPOINTS
    )
    return llava_tiny_processor("LlavaNextProcessor", image_processor, tokenizer)


LLAVA_NEXT = register(
    LLAVA.sibling(
        "llava_next",
        "LlavaNext",
        layout=layout,
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*TOWER_GEOMETRY, "image_grid_pinpoints"),
        title="LLaVA-NeXT",
        layout_notes="base view + any-res grid, unpadding, row newlines",
        released="llava-v1.6-mistral-7b-hf",
        cell_pixels=14,
    )
)
