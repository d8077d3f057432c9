"""LLaVA-OneVision (`llava_onevision`): any-res with downsampling, multi-image and video (layout:
`corelens.models.families.llava_onevision.tokens`). Tiny checkpoints: a SigLIP tower, all features kept, a video token."""

from __future__ import annotations

import transformers

from corelens.models.families.family import register, released_video_processor, video_as_given
from corelens.models.families.llava import (
    CHAT_TEMPLATE,
    IMAGE_TOKEN,
    LLAVA,
    TINY_PINPOINTS,
    TOWER_GEOMETRY,
    VIDEO_TOKEN,
    clip_tower,
    llava_tiny_config,
    tower,
)
from corelens.models.families.llava_onevision.tokens import onevision_layout

TINY_ASPECT = "anyres_max_2"  # OneVision downsamples grids above 2 tiles' worth of features (a 2 x 2 grid)


def layout(m, inputs, images: list, frames: list, times: list[float], sample: str | None):
    """Return the layout of one LLaVA-OneVision prompt (`onevision_layout`)."""
    tile, patch = tower(m)
    frame_size = frames[0].size if frames else None
    sizes = [im.size for im in images]
    return onevision_layout(
        inputs["input_ids"], m.processor, tile, sizes, frame_size, times, patch=patch, sample=sample
    )


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny LLaVA-OneVision config: a SigLIP tower, all features, the video token."""
    siglip = {k: v for k, v in clip_tower(vision_depth).items() if k != "projection_dim"}
    return llava_tiny_config(
        "llava_onevision",
        tokenizer,
        siglip | {"model_type": "siglip_vision_model"},
        sizes,
        image_grid_pinpoints=TINY_PINPOINTS,
        video_token_id=tokenizer.convert_tokens_to_ids(VIDEO_TOKEN),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio=TINY_ASPECT,
    )


def tiny_processor(tokenizer, *, side: int = 56):
    """Return LLaVA-OneVision's processor: `side`-pixel square tiles, the tiny pinpoints, a video processor."""
    square = {"height": side, "width": side}
    return transformers.LlavaOnevisionProcessor(
        transformers.LlavaOnevisionImageProcessor(size=square, image_grid_pinpoints=TINY_PINPOINTS),
        tokenizer,
        transformers.LlavaOnevisionVideoProcessor(size=square),
        num_image_tokens=(side // 14) ** 2,
        vision_feature_select_strategy="full",
        vision_aspect_ratio=TINY_ASPECT,
        image_token=IMAGE_TOKEN,
        video_token=VIDEO_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )


LLAVA_ONEVISION = register(
    LLAVA.sibling(
        "llava_onevision",
        "LlavaOnevision",
        layout=layout,
        geometry=lambda m: [],  # the processor counts tokens from num_image_tokens, checked by the layout
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*TOWER_GEOMETRY, "image_grid_pinpoints", "vision_aspect_ratio"),
        processor_kwargs=video_as_given,
        released_video_processor=released_video_processor("LlavaOnevisionVideoProcessor"),
        nested_images=True,  # one prompt's images as one nested list: the processor's multi-image mode
        title="LLaVA-OneVision",
        layout_notes="any-res + downsampling, multi-image squares, pooled video frames",
        released="llava-onevision-qwen2-7b-ov-hf",
        cell_pixels=14,
    )
)
