"""Qwen3-VL (`qwen3_vl`): Qwen2-VL's layout with 16-pixel patches, timestamped frame groups, deepstack."""

from __future__ import annotations

from corelens.models.families.family import register
from corelens.models.families.qwen2_5_vl import QWEN2_5_VL, tiny_tower
from corelens.models.families.qwen2_vl import QWEN_GEOMETRY, qwen_tiny_config, qwen_tiny_processor, rotary


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny Qwen3-VL config (16-pixel patches, deepstack from the last block, interleaved mrope)."""
    vision = tiny_tower(vision_depth, sizes["hidden"], 16)
    vision |= {"num_position_embeddings": 256, "deepstack_visual_indexes": [vision_depth - 1]}
    return qwen_tiny_config("qwen3_vl", vision, tokenizer, interleaved=True, **sizes)


def tiny_processor(tokenizer, **pixels):
    """Return Qwen3-VL's processor around `tokenizer` (`min_pixels`, `max_pixels`)."""
    return qwen_tiny_processor(tokenizer, "Qwen3VLProcessor", "Qwen3VLVideoProcessor", patch=16, **pixels)


QWEN3_VL = register(
    QWEN2_5_VL.sibling(
        "qwen3_vl",
        "Qwen3VL",
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*QWEN_GEOMETRY, "vision_config.num_position_embeddings"),
        vision_rotary=rotary("qwen3_vl"),
        title="Qwen3-VL",
        layout_notes="images, video (timestamps)",
        released="Qwen3-VL-8B-Instruct",
        cell_pixels=32,
    )
)
