"""Qwen2.5-VL (`qwen2_5_vl`): Qwen2-VL's layout, a windowed vision tower, video metadata for its rope."""

from __future__ import annotations

from corelens.models.families.family import register, video_as_given
from corelens.models.families.qwen2_vl import (
    QWEN2_VL,
    QWEN_GEOMETRY,
    qwen_tiny_config,
    qwen_tiny_processor,
    rotary,
)


def video_with_metadata(frame_times: list[float] | None, fps: float | None) -> dict:
    """Return `video_as_given` plus the sampled frames' metadata.

    Qwen2.5-VL spaces its temporal rope positions by the sampled fps (without it the processor assumes
    24 fps); Qwen3-VL writes it as timestamps (and its published video processor resamples at 2 fps by
    default, which `do_sample_frames=False` turns off).
    """
    out = video_as_given(frame_times, fps)
    if frame_times:
        indices = [round(t * fps) for t in frame_times]
        out["videos_kwargs"]["video_metadata"] = [
            {"fps": fps, "total_num_frames": max(indices) + 1, "frames_indices": indices}
        ]
    return out


def tiny_tower(depth: int, out_hidden: int, patch: int) -> dict:
    """Return the tiny vision tower of Qwen2.5-VL and Qwen3-VL (projected to the decoder's `out_hidden`)."""
    return {
        "depth": depth,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": out_hidden,
        "patch_size": patch,
    }


def tiny_config(tokenizer, *, vision_depth: int, **sizes):
    """Return a tiny Qwen2.5-VL config (14-pixel patches, 112-pixel windows, the last block full attention)."""
    vision = tiny_tower(vision_depth, sizes["hidden"], 14)
    vision |= {"window_size": 112, "fullatt_block_indexes": [vision_depth - 1]}
    return qwen_tiny_config("qwen2_5_vl", vision, tokenizer, **sizes)


def tiny_processor(tokenizer, **pixels):
    """Return Qwen2.5-VL's processor around `tokenizer` (`min_pixels`, `max_pixels`)."""
    return qwen_tiny_processor(tokenizer, "Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor", patch=14, **pixels)


QWEN2_5_VL = register(
    QWEN2_VL.sibling(
        "qwen2_5_vl",
        "Qwen2_5_VL",
        tiny_config=tiny_config,
        tiny_processor=tiny_processor,
        released_geometry=(*QWEN_GEOMETRY, "vision_config.window_size"),
        processor_kwargs=video_with_metadata,
        vision_rotary=rotary("qwen2_5_vl"),
        title="Qwen2.5-VL",
        layout_notes="images, video",
        released="Qwen2.5-VL-7B-Instruct",
        cell_pixels=28,
    )
)
