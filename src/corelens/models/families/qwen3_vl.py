"""Qwen3-VL (`qwen3_vl`): Qwen2-VL's layout with 16-pixel patches, timestamped frame groups, deepstack."""

from __future__ import annotations

from corelens.models.families.qwen2_5_vl import video_with_metadata
from corelens.models.families.qwen2_vl import (
    qwen_geometry,
    qwen_layout_of,
    qwen_released_video_processor,
    qwen_tiny_config,
    qwen_tiny_processor,
)
from corelens.models.registry import Family, FamilyInterface
from corelens.models.tiny_parts import build_tokenizer


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny Qwen3-VL config (16-pixel patches, deepstack from the last block, interleaved mrope)."""
    vision = {
        "depth": vision_depth,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": sizes["hidden"],
        "patch_size": 16,
        "num_position_embeddings": 256,
        "deepstack_visual_indexes": [vision_depth - 1],
    }
    return qwen_tiny_config("qwen3_vl", vision, tokenizer, interleaved=True, **sizes)


def tiny_processor(tokenizer, **pixels):
    """Return Qwen3-VL's processor around `tokenizer` (`min_pixels`, `max_pixels`)."""
    return qwen_tiny_processor(tokenizer, "Qwen3VLProcessor", "Qwen3VLVideoProcessor", patch=16, **pixels)


QWEN3_VL = FamilyInterface.register(
    Family(
        model_type="qwen3_vl",
        config_class="Qwen3VLConfig",
        model_class="Qwen3VLForConditionalGeneration",
        processor_class="Qwen3VLProcessor",
        layout=qwen_layout_of,
        geometry=qwen_geometry,
        tiny_tokenizer=build_tokenizer,
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(
            "vision_config.patch_size",
            "vision_config.spatial_merge_size",
            "vision_config.temporal_patch_size",
            "vision_config.num_position_embeddings",
        ),
        processor_kwargs=video_with_metadata,
        released_video_processor=qwen_released_video_processor,
        vision_rotary="transformers.models.qwen3_vl.modeling_qwen3_vl.apply_rotary_pos_emb_vision",
    )
)
