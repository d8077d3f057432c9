"""LLaVA-1.5 (`llava`), and what the LLaVA families share (layout: `corelens.models.families.llava.tokens`).

Tiny checkpoints: a CLIP vision tower of 56-pixel tiles and 14-pixel patches, a projector, a Qwen2 decoder,
with LLaVA-1.5's conversation format ("USER: <image>\\n... ASSISTANT:").
"""

from __future__ import annotations

from collections.abc import Iterable

import transformers

from corelens.models.families.family import Family, register
from corelens.models.families.llava.tokens import llava_layout
from corelens.models.tiny_parts import build_tokenizer, qwen2_text

IMAGE_TOKEN = "<image>"
VIDEO_TOKEN = "<video>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'video' %}<video>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% if message['role'] == 'user' %} {% else %}<|im_end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
# The tower's tile and patch, and which features reach the decoder (LLaVA-1.5; NeXT and OneVision add theirs).
TOWER_GEOMETRY = (
    "vision_config.image_size",
    "vision_config.patch_size",
    "vision_feature_layer",
    "vision_feature_select_strategy",
)
# LLaVA-NeXT's any-res resolutions, scaled to the tiny 56-pixel tiles (the released models use 336).
TINY_PINPOINTS = [[56, 112], [112, 56], [112, 112], [56, 168], [168, 56]]


def tower(m) -> tuple[int, int]:
    """Return the vision tower's input side and patch size: cells are placed by the tower's geometry."""
    vision = getattr(m.model.config, "vision_config", None)
    return int(getattr(vision, "image_size", None)), int(getattr(vision, "patch_size", None))


def patch_geometry(m) -> list[tuple]:
    """The processor's patch size (which counts the tokens) against the vision tower's."""
    return [("patch_size", m.processor.patch_size, m.model.config.vision_config.patch_size)]


def llava_tokenizer(words: Iterable[str] = ()):
    """Return the tiny tokenizer with LLaVA's `<image>` / `<video>` tokens and conversation template."""
    return build_tokenizer(words, (IMAGE_TOKEN, VIDEO_TOKEN), CHAT_TEMPLATE)


def clip_tower(vision_depth: int) -> dict:
    """Return the tiny CLIP vision tower: 56-pixel tiles of 14-pixel patches."""
    return {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": max(2, vision_depth),
        "num_attention_heads": 2,
        "image_size": 56,
        "patch_size": 14,
        "projection_dim": 32,
    }


def llava_tiny_config(model_type: str, tokenizer, vision: dict, sizes: dict, **top):
    """Return a tiny LLaVA-style config of `model_type`: `vision` tower, a projector, a Qwen2 decoder of `sizes`.

    `top`: the family's own top-level config fields (over LLaVA-1.5's feature layer and strategy).
    """
    return transformers.AutoConfig.for_model(
        model_type,
        text_config=qwen2_text(tokenizer, **sizes),
        vision_config=vision,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        **{"vision_feature_layer": -2, "vision_feature_select_strategy": "default"} | top,
        projector_hidden_act="gelu",
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tie_word_embeddings=True,
    )


def llava_tiny_processor(processor_class: str, image_processor, tokenizer):
    """Return a LLaVA-1.5 / NeXT processor: 14-pixel patches, the CLS feature dropped ("default")."""
    return getattr(transformers, processor_class)(
        image_processor,
        tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )


def crop_recipe(side: int) -> dict:
    """CLIP's recipe: shortest edge -> `side`, then a centre crop of `side` x `side`."""
    return {"size": {"shortest_edge": side}, "crop_size": {"height": side, "width": side}}


def layout(m, inputs, images: list, frames: list, times: list[float], sample: str | None):
    """Return the layout of one LLaVA-1.5 prompt (one grid per image, `llava_layout`)."""
    _, patch = tower(m)
    return llava_layout(
        inputs["input_ids"], m.processor, [im.size for im in images], patch=patch, sample=sample
    )


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny LLaVA-1.5 config."""
    return llava_tiny_config("llava", tokenizer, clip_tower(vision_depth), sizes)


def tiny_processor(tokenizer, *, side: int = 56, pad: bool = False):
    """Return LLaVA-1.5's processor; `pad`: LLaVA-1.5's "pad" aspect mode (pad to a square first)."""
    image_processor = transformers.LlavaImageProcessor(**crop_recipe(side), do_pad=pad)
    return llava_tiny_processor("LlavaProcessor", image_processor, tokenizer)


LLAVA = register(
    Family.of(
        "llava",
        "Llava",
        layout=layout,
        geometry=patch_geometry,
        tiny_tokenizer=llava_tokenizer,
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*TOWER_GEOMETRY,),
        processor_kwargs=None,  # images only
        title="LLaVA-1.5",
        layout_notes="pad / resize / centre crop",
        released="llava-1.5-7b-hf",
        cell_pixels=14,
    )
)
