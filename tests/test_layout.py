"""Layouts against the real processors, with position-encoded images (docs/methods.md#layout)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import position_image, released_processor
from transformers import AutoProcessor

from corelens.data.sample import Target
from corelens.layout import Layout, Segment
from corelens.models.families.qwen2_vl.tokens import qwen_layout
from corelens.models.prepare import messages, processor_kwargs


def _decode_tokens(ip, pixel_values: torch.Tensor, grid: tuple[int, int, int]) -> np.ndarray:
    """Return, per merged visual token (in processor order), the mean un-normalised RGB of its patches."""
    t, h, w = grid
    m = ip.merge_size
    rows = pixel_values.reshape(t * h * w, 3, -1).double()
    mean = torch.tensor(ip.image_mean, dtype=torch.float64)[None, :, None]
    std = torch.tensor(ip.image_std, dtype=torch.float64)[None, :, None]
    rgb = (rows * std + mean).mean(-1)  # (patches, 3) in [0, 1]
    return rgb.reshape(t * h * w // (m * m), m * m, 3).mean(1).numpy()


def _check_grid(segment: Segment, rgb: np.ndarray) -> None:
    """Every token's decoded pixel position lies at the centre of the cell the layout assigns to it."""
    xs, ys = segment.cell_spans()
    w, h = segment.orig_size
    for k, token in enumerate(segment.pixel_tokens()):
        r, c = divmod(int(token - segment.start), segment.row_stride)
        x, y = rgb[k, 0] * w, rgb[k, 1] * h
        cx, cy = xs[c].mean(), ys[r].mean()
        assert abs(x - cx) < 0.25 * (xs[c, 1] - xs[c, 0]) + 1.0, (k, r, c, x, cx)
        assert abs(y - cy) < 0.25 * (ys[r, 1] - ys[r, 0]) + 1.0, (k, r, c, y, cy)


@pytest.fixture(params=["tiny", "released"])
def qwen_processor(request, tiny_dir, family):
    """The family's processor: the tiny test geometry, then the released checkpoint's published files."""
    if request.param == "tiny":
        return AutoProcessor.from_pretrained(tiny_dir(family))
    return released_processor(family)


def _sample_like(n_images: int, video: bool):
    class S:
        images = [None] * n_images
        question = "what is the colour of the cup ?"

    S.video = object() if video else None
    return S


@pytest.mark.parametrize("sizes", [[(301, 173)], [(173, 301)], [(301, 173), (97, 411), (64, 64)]])
def test_image_layout_matches_processor(qwen_processor, sizes):
    processor = qwen_processor
    images = [position_image(w, h) for w, h in sizes]
    text = processor.apply_chat_template(
        messages(_sample_like(len(images), False)), add_generation_prompt=True
    )
    inputs = processor(text=[text], images=images, return_tensors="pt")
    layout = qwen_layout(inputs["input_ids"], processor, inputs["image_grid_thw"], None, sizes)
    assert [s.source for s in layout.segments] == list(range(len(sizes)))
    ids = inputs["input_ids"][0]
    assert (ids[layout.visual] == processor.image_token_id).all()
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    offset = 0
    for seg, grid in zip(layout.segments, inputs["image_grid_thw"].tolist()):
        n = grid[0] * grid[1] * grid[2]
        _check_grid(
            seg,
            _decode_tokens(
                processor.image_processor, inputs["pixel_values"][offset : offset + n], tuple(grid)
            ),
        )
        offset += n


# 4 fps: Qwen3-VL's published video processor would resample a 4 fps clip to 2 fps unless told not to.
@pytest.mark.parametrize("fps", [2.0, 4.0])
def test_video_layout_matches_processor(qwen_processor, family, fps):
    processor = qwen_processor
    n_frames, size = 5, (150, 90)
    frames = [position_image(*size, frame=f / (n_frames - 1)) for f in range(n_frames)]
    times = [f / fps for f in range(n_frames)]
    text = processor.apply_chat_template(messages(_sample_like(0, True)), add_generation_prompt=True)
    extra = processor_kwargs(family, times, fps)
    inputs = processor(text=[text], videos=[frames], return_tensors="pt", **extra)
    grid = tuple(inputs["video_grid_thw"][0].tolist())
    layout = qwen_layout(inputs["input_ids"], processor, None, inputs["video_grid_thw"], [], size, times)
    assert len(layout.segments) == grid[0] == 3  # 5 frames -> groups (0, 1), (2, 3), (4, 4 repeated)
    assert [s.frames for s in layout.segments] == [(0, 1), (2, 3), (4,)]
    assert layout.segments[1].time_span == (2 / fps, 4 / fps)
    per_group = grid[1] * grid[2]
    ids = inputs["input_ids"][0]
    assert (ids[layout.visual] == processor.video_token_id).all()
    for g, seg in enumerate(layout.segments):
        pv = inputs["pixel_values_videos"][g * per_group : (g + 1) * per_group]
        rgb = _decode_tokens(processor.video_processor, pv, (1, grid[1], grid[2]))
        _check_grid(seg, rgb)
        decoded_frame = rgb[:, 2].mean() * (n_frames - 1)
        assert abs(decoded_frame - np.mean([seg.frames[0], seg.frames[-1]])) < 0.1


def _segment(**kw) -> Segment:
    base = dict(kind="image", source=0, start=10, rows=4, cols=6, orig_size=(600, 400))
    base.update(kw)
    return Segment(**base)


def test_box_rules():
    seg = _segment()  # cells are 100 x 100 px
    box = (150, 50, 260, 120)  # overlaps cols 1-2, rows 0-1
    assert seg.tokens_in_box(box, "any").tolist() == [11, 12, 17, 18]
    assert seg.tokens_in_box(box, "centre").tolist() == [11, 12]
    assert seg.tokens_in_box(box, "coverage", tau=0.3).tolist() == [12]
    # Touching a cell edge is no overlap.
    assert seg.tokens_in_box((100, 100, 200, 200), "any").tolist() == [17]


def test_row_newline_tokens_are_visual_but_never_in_omega():
    seg = _segment(row_newline=True)
    layout = Layout((seg,), 100)
    assert len(layout.visual) == 4 * 7
    omega = layout.omega([Target("image", image=0)])
    assert len(omega) == 24 and not set(omega) & {16, 23, 30, 37}


def test_tube_uses_groups_that_overlap_in_time():
    groups = [
        _segment(kind="video", start=10 + 24 * g, frames=(2 * g, 2 * g + 1), time_span=(g, g + 1.0))
        for g in range(3)
    ]
    layout = Layout(tuple(groups), 200)
    tube = Target("tube", frames=(1, 4), boxes=((0, 0, 50, 50), (550, 350, 600, 400)))
    # Group 0 has frame 1 (top-left cell), group 1 lies between annotations, group 2 has frame 4.
    assert layout.omega([tube]).tolist() == [10, 34, 34 + 23, 58 + 23]
    with pytest.raises(Exception, match="overlaps no sampled frame"):
        layout.omega([Target("tube", frames=(9,), boxes=((0, 0, 5, 5),))])


def test_padding_cells_follow_the_rule():
    # A 600 x 300 image padded to a 600 x 600 square (centred): rows 0 and 3 of a 4 x 6 grid hold only padding.
    seg = _segment(orig_size=(600, 300), region=(0.0, -150.0, 600.0, 450.0), trailing=1)
    assert seg.padding_cells()[:, 0].tolist() == [True, False, False, True]
    padding = {10 + c for c in range(6)} | {28 + c for c in range(6)}
    whole = [Target("image", image=0)]
    default = Layout((seg,), 100)
    assert default.padding == "visual"
    assert len(default.visual) == 4 * 6 + 1 and padding <= set(default.visual)  # in V (with the newline)
    assert len(default.omega(whole)) == 12 and not padding & set(default.omega(whole))  # never in Omega
    assert set(Layout((seg,), 100, padding="omega").omega(whole)) == set(range(10, 34))
    none = Layout((seg,), 100, padding="none")
    assert not padding & set(none.visual) and len(none.visual) == 12 + 1  # the newline stays in V
    assert none.omega(whole).tolist() == default.omega(whole).tolist()
    # A box that reaches into the padding takes the padding cell only under "omega".
    box = [Target("box", image=0, box=(0, -50, 100, 300))]
    assert Layout((seg,), 100).omega(box).tolist() == [16, 22]
    assert Layout((seg,), 100, padding="omega").omega(box).tolist() == [10, 16, 22]
    with pytest.raises(Exception, match="unknown padding rule"):
        Layout((seg,), 100, padding="pad")


def test_a_resampled_video_is_refused():
    """A processor that drops frames (groups != frames / temporal patch) is an error, not a wrong layout."""
    from corelens.errors import InputError

    processor = released_processor("qwen3_vl")
    frames = [position_image(150, 90, frame=f / 7) for f in range(8)]
    times = [f / 4.0 for f in range(8)]
    text = processor.apply_chat_template(messages(_sample_like(0, True)), add_generation_prompt=True)
    inputs = processor(text=[text], videos=[frames], return_tensors="pt")  # resamples to 2 fps by default
    with pytest.raises(InputError, match="resampled the frames"):
        qwen_layout(inputs["input_ids"], processor, None, inputs["video_grid_thw"], [], (150, 90), times)
