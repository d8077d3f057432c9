"""LLaVA-NeXT (`llava_next`): a base view and an any-res grid per image (layout: `corelens.models.llava_next`)."""

from __future__ import annotations

import transformers

from corelens.models.families.llava import (
    TINY_PINPOINTS,
    TOWER_GEOMETRY,
    clip_tower,
    crop_recipe,
    llava_tiny_config,
    llava_tiny_processor,
    llava_tokenizer,
    patch_geometry,
    tower,
)
from corelens.models.llava_next import llava_next_layout
from corelens.models.registry import Family, FamilyInterface


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


LLAVA_NEXT = FamilyInterface.register(
    Family(
        model_type="llava_next",
        config_class="LlavaNextConfig",
        model_class="LlavaNextForConditionalGeneration",
        processor_class="LlavaNextProcessor",
        layout=layout,
        geometry=patch_geometry,
        tiny_tokenizer=llava_tokenizer,
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*TOWER_GEOMETRY, "image_grid_pinpoints"),
        processor_kwargs=None,  # images only
    )
)
