"""Qwen2-VL (`qwen2_vl`), and what the Qwen-VL families share (their layout: `corelens.models.families.qwen2_vl.tokens`)."""

from __future__ import annotations

import transformers

from corelens.models.effective import effective_images_kwargs
from corelens.models.families.family import Family, register
from corelens.models.families.qwen2_vl.tokens import qwen_layout
from corelens.models.tiny_parts import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer, qwen2_text


def qwen_layout_of(m, inputs, images: list, frames: list, times: list[float], sample: str | None):
    """Return the layout of processed `inputs` from the processor's grids (`qwen_layout`)."""
    return qwen_layout(
        inputs["input_ids"],
        m.processor,
        inputs.get("image_grid_thw"),
        inputs.get("video_grid_thw"),
        [im.size for im in images],
        frames[0].size if frames else None,
        times,
        sample=sample,
    )


def qwen_geometry(m) -> list[tuple]:
    """The processor's patch and merge sizes against the vision tower's."""
    vision = m.model.config.vision_config
    settings = effective_images_kwargs(m.processor)
    return [
        ("patch_size", settings.get("patch_size"), vision.patch_size),
        ("merge_size", settings.get("merge_size"), vision.spatial_merge_size),
    ]


def qwen_tiny_config(
    model_type: str,
    vision: dict,
    tokenizer,
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    interleaved: bool = False,
):
    """Return a tiny Qwen-VL config: `vision` tower, a Qwen2-style decoder with mrope over `head_dim`."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    half = head_dim // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    if interleaved:  # Qwen3-VL interleaves the t / h / w rope sections
        rope["mrope_interleaved"] = True
    text = qwen2_text(tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate)
    text.pop("model_type")
    text |= {"max_position_embeddings": 32768, "rope_parameters": rope, "bos_token_id": None}
    return transformers.AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=True,
    )


def qwen_tiny_processor(
    tokenizer,
    processor_class: str,
    video_processor_class: str,
    *,
    patch: int,
    min_pixels: int = 4 * 32 * 32,
    max_pixels: int = 64 * 32 * 32,
):
    """Return a Qwen-VL processor around `tokenizer` with small pixel budgets (2 x 2 merge, 2-frame groups)."""
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    image_processor = transformers.Qwen2VLImageProcessor(
        patch_size=patch, size=size, merge_size=2, temporal_patch_size=2
    )
    video_processor = getattr(transformers, video_processor_class)(
        patch_size=patch,
        size=size,
        merge_size=2,
        temporal_patch_size=2,
        do_sample_frames=False,
        cap_pixels_per_frame=False,
    )
    cls = getattr(transformers, processor_class)
    return cls(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)


def qwen_released_video_processor(image_processor):
    """Qwen2/2.5-VL publish one preprocessor_config.json for images and video: the video takes its settings."""
    keys = ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std", "size")
    return transformers.Qwen2VLVideoProcessor(**{k: getattr(image_processor, k) for k in keys})


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny Qwen2-VL config (14-pixel patches)."""
    vision = {
        "depth": vision_depth,
        "embed_dim": 32,
        "hidden_size": sizes["hidden"],
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
    }
    return qwen_tiny_config("qwen2_vl", vision, tokenizer, **sizes)


def tiny_processor(tokenizer, **pixels):
    """Return Qwen2-VL's processor around `tokenizer` (`min_pixels`, `max_pixels`)."""
    return qwen_tiny_processor(tokenizer, "Qwen2VLProcessor", "Qwen2VLVideoProcessor", patch=14, **pixels)


# The Qwen-VL merge geometry; Qwen2.5-VL and Qwen3-VL add theirs to it.
QWEN_GEOMETRY = (
    "vision_config.patch_size",
    "vision_config.spatial_merge_size",
    "vision_config.temporal_patch_size",
)


def rotary(module: str) -> str:
    """Return the vision rotary embedding of transformers' `models/<module>/modeling_<module>.py`."""
    return f"transformers.models.{module}.modeling_{module}.apply_rotary_pos_emb_vision"


QWEN2_VL = register(
    Family.of(
        "qwen2_vl",
        "Qwen2VL",
        layout=qwen_layout_of,
        geometry=qwen_geometry,
        tiny_tokenizer=build_tokenizer,
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=QWEN_GEOMETRY,
        released_video_processor=qwen_released_video_processor,
        vision_rotary=rotary("qwen2_vl"),
        title="Qwen2-VL",
        layout_notes="images, video",
        released="Qwen2-VL-7B-Instruct",
        cell_pixels=28,
    )
)
