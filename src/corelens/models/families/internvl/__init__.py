"""InternVL3 / 3.5 (`internvl`, the transformers-native checkpoints): tiles + thumbnail (layout:
`corelens.models.families.internvl.tokens`). Tiny checkpoints: an InternViT tower of 112-pixel tiles, 16 tokens each."""

from __future__ import annotations

from collections.abc import Iterable

import transformers

from corelens.models.effective import effective_images_kwargs
from corelens.models.families.family import Family, register, released_video_processor
from corelens.models.families.internvl.tokens import internvl_layout
from corelens.models.families.llava import TOWER_GEOMETRY
from corelens.models.tiny_parts import CHAT_TEMPLATE as QWEN_TEMPLATE
from corelens.models.tiny_parts import build_tokenizer, qwen2_text

TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
TILE = 112
# InternVL3's template: Qwen-style turns; an image is `<IMG_CONTEXT>` (the processor expands it to
# `<img>` + tiles + `</img>`), a video `<video>` (expanded to `FrameN: <img>...</img>` per frame).
CHAT_TEMPLATE = QWEN_TEMPLATE.replace(
    "<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>\n"
).replace("<|vision_start|><|video_pad|><|vision_end|>", "<video>\n")


def _pair(value) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def geometry(m) -> list[tuple]:
    """Tokens per tile and the tile side, the processor's against the vision tower's (after pixel shuffle)."""
    vision = m.model.config.vision_config
    side = _pair(vision.image_size) // _pair(vision.patch_size) * m.model.config.downsample_ratio
    size = effective_images_kwargs(m.processor).get("size") or {}
    height = size.get("height") if isinstance(size, dict) else getattr(size, "height", None)
    return [
        ("image_seq_length", m.processor.image_seq_length, int(side) ** 2),
        ("size.height", height, _pair(vision.image_size)),
    ]


def layout(m, inputs, images: list, frames: list, times: list[float], sample: str | None):
    """Return the layout of one InternVL prompt (`internvl_layout`)."""
    frame_size = frames[0].size if frames else None
    sizes = [im.size for im in images]
    return internvl_layout(inputs["input_ids"], m.processor, sizes, frame_size, times, sample=sample)


def tiny_tokenizer(words: Iterable[str] = ()):
    """Return the tiny tokenizer with InternVL's named image tokens and template."""
    return build_tokenizer(words, tuple(TOKENS.values()), CHAT_TEMPLATE, named=TOKENS)


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return an InternVL3 config: an InternViT tower (112 px tiles, 16 tokens each), a Qwen2 decoder."""
    vision = {
        "model_type": "internvl_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": vision_depth,
        "num_attention_heads": 2,
        "image_size": [TILE, TILE],
        "patch_size": [14, 14],
    }
    return transformers.AutoConfig.for_model(
        "internvl",
        text_config=qwen2_text(tokenizer, **sizes),
        vision_config=vision,
        image_token_id=tokenizer.context_image_token_id,
        image_seq_length=(TILE // 28) ** 2,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )


def tiny_processor(tokenizer, *, max_patches: int = 6):
    """Return InternVL's processor: GOT-OCR2 tiling (1-`max_patches` tiles + thumbnail), 112 px tiles."""
    tile = {"height": TILE, "width": TILE}
    return transformers.InternVLProcessor(
        transformers.GotOcr2ImageProcessor(
            size=tile, crop_to_patches=True, min_patches=1, max_patches=max_patches
        ),
        tokenizer,
        transformers.InternVLVideoProcessor(size=tile),
        image_seq_length=(TILE // 28) ** 2,
        chat_template=CHAT_TEMPLATE,
    )


INTERNVL = register(
    Family.of(
        "internvl",
        "InternVL",
        layout=layout,
        geometry=geometry,
        tiny_tokenizer=tiny_tokenizer,
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*TOWER_GEOMETRY, "downsample_ratio", "image_seq_length"),
        released_video_processor=released_video_processor("InternVLVideoProcessor"),
        title="InternVL3 / 3.5",
        layout_notes=(
            "tiles + thumbnail in `<img>` blocks, video frames; token order checked through the model's pixel shuffle"
        ),
        released="InternVL3-8B-hf",
        cell_pixels=28,
    )
)
