"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: prompts, processor quirks and the visual token layout.

Images become one run of `<|image_pad|>` tokens each, `grid_h * grid_w / merge^2` long, in row-major order of
the merged 2x2 patch groups over the resized image (a pure rescale of the whole image). Videos become
`grid_t` groups of `temporal_patch_size` frames; Qwen2/2.5-VL emit one run for the whole video (sliced
uniformly into groups), Qwen3-VL one run per group after a `<t seconds>` timestamp (boundary marking).
"""

from __future__ import annotations

import numpy as np
import torch

from corelens.errors import InputError
from corelens.layout import Layout, Segment


def token_runs(ids: np.ndarray, token_id: int) -> list[tuple[int, int]]:
    """Return the [start, end) spans of consecutive runs of `token_id` in `ids`."""
    hit = np.concatenate([[False], ids == token_id, [False]])
    edges = np.flatnonzero(np.diff(hit.astype(np.int8)))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def _video_segments(
    positions: np.ndarray,
    grid: tuple[int, int, int],
    merge: int,
    temporal: int,
    source: int,
    frame_size: tuple[int, int],
    frame_times: list[float],
    sample: str | None,
) -> list[Segment]:
    t, h, w = grid
    rows, cols = h // merge, w // merge
    per_group = rows * cols
    segments = []
    n_frames = len(frame_times)
    if t != -(-n_frames // temporal):
        raise InputError(
            f"video {source}: the processor made {t} frame groups of {temporal} from {n_frames} frames "
            f"(expected {-(-n_frames // temporal)}): it resampled the frames",
            sample=sample,
        )
    step = frame_times[1] - frame_times[0] if n_frames > 1 else 1.0
    for g in range(t):
        span = positions[g * per_group : (g + 1) * per_group]
        if len(span) != per_group or span[-1] - span[0] != per_group - 1:
            raise InputError(
                f"video {source}: frame group {g} is not one contiguous token run", sample=sample
            )
        # The processor pads the last group by repeating the last frame.
        frames = tuple(sorted({min(g * temporal + k, n_frames - 1) for k in range(temporal)}))
        time_span = (frame_times[frames[0]], frame_times[frames[-1]] + step)
        segments.append(
            Segment("video", source, int(span[0]), rows, cols, frame_size, frames=frames, time_span=time_span)
        )
    return segments


def qwen_layout(
    input_ids: torch.Tensor,
    processor,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    image_sizes: list[tuple[int, int]],
    frame_size: tuple[int, int] | None = None,
    frame_times: list[float] | None = None,
    *,
    sample: str | None = None,
) -> Layout:
    """Return the layout of one Qwen-VL prompt from the processor's outputs and the original sizes."""
    ids = input_ids.reshape(-1).cpu().numpy()
    merge = processor.image_processor.merge_size
    segments: list[Segment] = []
    image_runs = token_runs(ids, processor.image_token_id)
    grids = [] if image_grid_thw is None else image_grid_thw.tolist()
    if len(image_runs) != len(grids) or len(grids) != len(image_sizes):
        raise InputError(
            f"found {len(image_runs)} image token runs for {len(grids)} processed and {len(image_sizes)} given images",
            sample=sample,
        )
    for i, ((start, end), (t, h, w)) in enumerate(zip(image_runs, grids)):
        rows, cols = h // merge, w // merge
        if end - start != t * rows * cols:
            raise InputError(f"image {i}: {end - start} tokens, expected {t * rows * cols}", sample=sample)
        segments.append(Segment("image", i, start, rows, cols, tuple(image_sizes[i])))
    if video_grid_thw is not None and len(video_grid_thw):
        positions = np.flatnonzero(ids == processor.video_token_id)
        temporal = processor.video_processor.temporal_patch_size
        offset = 0
        for v, (t, h, w) in enumerate(video_grid_thw.tolist()):
            count = t * h * w // merge**2
            segments.extend(
                _video_segments(
                    positions[offset : offset + count],
                    (t, h, w),
                    merge,
                    temporal,
                    v,
                    frame_size,
                    frame_times,
                    sample,
                )
            )
            offset += count
        if offset != len(positions):
            raise InputError(f"{len(positions)} video tokens, expected {offset}", sample=sample)
    return Layout(tuple(segments), int(len(ids)))
