"""LLaVA-1.5: the layout against the real processor (centre crop and pad-to-square), images only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import position_image

import corelens
from corelens.data.sample import Sample, Target, Video
from corelens.errors import UnsupportedModelError
from corelens.models.llava import grid_region, llava_layout
from corelens.models.prepare import messages, prepare
from corelens.models.tiny import build_tiny_checkpoint, tiny_processor, tiny_tokenizer

SIZES = [[(301, 173)], [(173, 301)], [(97, 411), (64, 64), (56, 56)]]


def _sample_like(n_images: int):
    class S:
        images = [None] * n_images
        video = None
        question = "what is the colour of the cup ?"

    return S


def _patch_positions(ip, pixel_values: torch.Tensor, patch: int) -> np.ndarray:
    """Return (rows * cols, 3): per patch of the processed image, the mean un-normalised RGB."""
    mean = torch.tensor(ip.image_mean, dtype=torch.float64)[:, None, None]
    std = torch.tensor(ip.image_std, dtype=torch.float64)[:, None, None]
    rgb = pixel_values.double() * std + mean  # (3, H, W) in [0, 1]
    c, h, w = rgb.shape
    blocks = rgb.reshape(c, h // patch, patch, w // patch, patch).mean((2, 4))
    return blocks.permute(1, 2, 0).reshape(-1, 3).numpy()


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("sizes", SIZES)
def test_layout_matches_the_processor(sizes, pad):
    processor = tiny_processor("llava", tiny_tokenizer("llava", ["cup"]), pad=pad)
    images = [position_image(w, h) for w, h in sizes]
    text = processor.apply_chat_template(messages(_sample_like(len(images))), add_generation_prompt=True)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    layout = llava_layout(inputs["input_ids"], processor, sizes)
    ids = inputs["input_ids"][0]
    assert (ids[layout.visual] == processor.image_token_id).all()
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    inside = 0
    for i, segment in enumerate(layout.segments):
        assert segment.source == i and (segment.rows, segment.cols) == (4, 4)
        rgb = _patch_positions(processor.image_processor, inputs["pixel_values"][i], processor.patch_size)
        xe, ye = segment.cell_edges()
        w, h = segment.orig_size
        for k, token in enumerate(segment.pixel_tokens()):
            r, c = divmod(int(token - segment.start), segment.row_stride)
            cx, cy = (xe[c] + xe[c + 1]) / 2, (ye[r] + ye[r + 1]) / 2
            if not (0 <= cx < w and 0 <= cy < h):
                continue  # a padding cell: no image pixel to decode
            inside += 1
            assert abs(rgb[k, 0] * w - cx) < 0.25 * (xe[1] - xe[0]) + 1.0, (i, k, rgb[k, 0] * w, cx)
            assert abs(rgb[k, 1] * h - cy) < 0.25 * (ye[1] - ye[0]) + 1.0, (i, k, rgb[k, 1] * h, cy)
    assert inside >= 8  # cells whose centre shows the image (a 97 px wide image padded to 411 has none)


def test_crop_and_pad_regions():
    ip = tiny_processor("llava", tiny_tokenizer("llava"), pad=False).image_processor
    region, size = grid_region((301, 173), ip)  # 173 -> 56: the sides of the wide image are cut
    assert size == (56, 56) and region[1] == 0 and region[3] == pytest.approx(173)
    assert region[0] > 0 and region[2] < 301 and region[2] - region[0] == pytest.approx(173, abs=4)
    ip = tiny_processor("llava", tiny_tokenizer("llava"), pad=True).image_processor
    region, _ = grid_region((301, 173), ip)  # padded to 301 x 301: the grid reaches above and below
    assert (
        region[0] == 0
        and region[2] == pytest.approx(301)
        and region[1] == -64
        and region[3] == pytest.approx(237)
    )


def test_box_outside_the_crop_covers_no_token(tmp_path):
    path = build_tiny_checkpoint("llava", tmp_path / "m", words=["cup"], layers=1, heads=2, kv_heads=1)
    m = corelens.load(path)
    image = tmp_path / "wide.png"
    position_image(301, 173).save(image)
    left = Target("box", image=0, box=(0.0, 0.0, 40.0, 173.0))  # cut away by the centre crop
    middle = Target("box", image=0, box=(130.0, 60.0, 170.0, 110.0))
    sample = Sample(
        "w", "image", "what is the colour of the cup ?", images=(image,), image_sizes=((301, 173),)
    )
    layout = prepare(m, sample).layout
    assert len(layout.omega((left,))) == 0
    assert 1 <= len(layout.omega((middle,))) <= 4


def test_video_is_refused_with_a_clear_error(tmp_path):
    path = build_tiny_checkpoint("llava", tmp_path / "m", words=["cup"], layers=1, heads=2, kv_heads=1)
    m = corelens.load(path)
    frames = []
    for f in range(2):
        frames.append(tmp_path / f"f{f}.png")
        position_image(64, 64).save(frames[-1])
    sample = Sample(
        "v", "video", "what is the colour of the cup ?", video=Video(tuple(frames), None, 2.0, None)
    )
    with pytest.raises(UnsupportedModelError, match="images only"):
        prepare(m, sample)


def _check_cells(segment, rgb_of_cell) -> int:
    """Assert each in-image cell's decoded position is its centre; return how many cells were checked."""
    xe, ye = segment.cell_edges()
    w, h = segment.orig_size
    checked = 0
    for r in range(segment.rows):
        for c in range(segment.cols):
            cx, cy = (xe[c] + xe[c + 1]) / 2, (ye[r] + ye[r + 1]) / 2
            if not (0 <= cx < w and 0 <= cy < h):
                continue
            x, y = rgb_of_cell(r, c)[:2] * (w, h)
            assert abs(x - cx) < 0.25 * (xe[1] - xe[0]) + 1.0, (segment.view, r, c, x, cx)
            assert abs(y - cy) < 0.25 * (ye[1] - ye[0]) + 1.0, (segment.view, r, c, y, cy)
            checked += 1
    return checked


@pytest.mark.parametrize("sizes", [[(301, 173)], [(173, 301)], [(97, 411), (64, 64)], [(120, 100)]])
def test_llava_next_layout_matches_the_processor(sizes):
    from corelens.models.llava_next import llava_next_layout

    processor = tiny_processor("llava_next", tiny_tokenizer("llava_next", ["cup"]))
    images = [position_image(w, h) for w, h in sizes]
    text = processor.apply_chat_template(messages(_sample_like(len(images))), add_generation_prompt=True)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    layout = llava_next_layout(inputs["input_ids"], processor, 56, sizes)
    ids = inputs["input_ids"][0]
    assert (ids[layout.visual] == processor.image_token_id).all()
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    ip, patch = processor.image_processor, processor.patch_size
    for i in range(len(sizes)):
        base, grid = layout.segments[2 * i : 2 * i + 2]
        assert (base.view, grid.view, grid.row_newline) == ("base", "grid", True)
        tiles = [_patch_positions(ip, t, patch).reshape(4, 4, 3) for t in inputs["pixel_values"][i]]
        assert _check_cells(base, lambda r, c, t=tiles[0]: t[r, c]) == 16
        # Grid cell (r, c) is feature (r + r0, c + c0) of the stitched tiles; r0 / c0: rows / columns unpadded.
        best_h, best_w = select_best(sizes[i], ip.image_grid_pinpoints)
        per_row = best_w // 56
        r0 = ((best_h // 56) * 4 - grid.rows) // 2
        c0 = (per_row * 4 - grid.cols) // 2

        def cell(r, c, tiles=tiles, r0=r0, c0=c0, per_row=per_row):
            fr, fc = r + r0, c + c0
            return tiles[1 + (fr // 4) * per_row + fc // 4][fr % 4, fc % 4]

        assert _check_cells(grid, cell) >= min(grid.rows * grid.cols, 4)


def select_best(size, pinpoints):
    from transformers.image_processing_utils import select_best_resolution

    return select_best_resolution((size[1], size[0]), pinpoints)


def _onevision():
    return tiny_processor("llava_onevision", tiny_tokenizer("llava_onevision", ["cup"]))


@pytest.mark.parametrize("size", [(301, 173), (120, 100), (56, 150), (173, 301)])
def test_onevision_single_image_layout(size):
    from corelens.models.llava_next import anyres_grid
    from corelens.models.llava_onevision import onevision_layout

    processor = _onevision()
    text = processor.apply_chat_template(messages(_sample_like(1)), add_generation_prompt=True)
    inputs = processor(text=[text], images=[position_image(*size)], return_tensors="pt")
    layout = onevision_layout(inputs["input_ids"], processor, 56, [size])
    ids = inputs["input_ids"][0]
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    base, grid = layout.segments
    ip = processor.image_processor
    tiles = [_patch_positions(ip, t, 14).reshape(4, 4, 3) for t in inputs["pixel_values"][0]]
    assert _check_cells(base, lambda r, c: tiles[0][r, c]) == 16
    rows, cols, region = anyres_grid(size, processor, 56, 4)
    assert grid.region == region and grid.row_newline
    if rows * cols <= 2 * 16:  # not downsampled: every cell is one feature of the stitched tiles
        assert (grid.rows, grid.cols) == (rows, cols)
        best_h, best_w = select_best(size, ip.image_grid_pinpoints)
        per_row = best_w // 56
        r0, c0 = ((best_h // 56) * 4 - rows) // 2, (per_row * 4 - cols) // 2

        def cell(r, c):
            fr, fc = r + r0, c + c0
            return tiles[1 + (fr // 4) * per_row + fc // 4][fr % 4, fc % 4]

        assert _check_cells(grid, cell) >= 4
    else:  # resized bilinearly over the same region to fit 2 tiles' worth of features
        assert grid.rows < rows and grid.cols < cols and grid.rows * grid.cols <= 2 * 16 * 1.21


def test_onevision_several_images_are_padded_squares_with_a_newline():
    from corelens.models.llava_onevision import onevision_layout

    processor = _onevision()
    sizes = [(301, 173), (64, 64)]
    text = processor.apply_chat_template(messages(_sample_like(2)), add_generation_prompt=True)
    # One prompt's images as one nested list: OneVision's multi-image mode (per-image anyres is off).
    inputs = processor(text=[text], images=[[position_image(*s) for s in sizes]], return_tensors="pt")
    layout = onevision_layout(inputs["input_ids"], processor, 56, sizes)
    ids = inputs["input_ids"][0]
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual) == 2 * (16 + 1)
    for i, segment in enumerate(layout.segments):
        assert segment.trailing == 1 and (segment.rows, segment.cols) == (4, 4)
        cells = _patch_positions(processor.image_processor, inputs["pixel_values"][i][0], 14).reshape(4, 4, 3)
        assert _check_cells(segment, lambda r, c, cells=cells: cells[r, c]) >= 8


def test_onevision_video_frames_are_pooled_with_one_newline():
    from corelens.models.llava_onevision import onevision_layout

    processor = _onevision()
    frames = [position_image(150, 90, frame=f / 4) for f in range(5)]
    sample = _sample_like(0)
    sample.video = object()
    text = processor.apply_chat_template(messages(sample), add_generation_prompt=True)
    inputs = processor(text=[text], videos=[frames], return_tensors="pt")
    times = [f / 2.0 for f in range(5)]
    layout = onevision_layout(inputs["input_ids"], processor, 56, [], (150, 90), times)
    ids = inputs["input_ids"][0]
    assert int((ids == processor.video_token_id).sum()) == len(layout.visual) == 5 * 4 + 1
    video = inputs["pixel_values_videos"][0]
    for f, segment in enumerate(layout.segments):
        assert segment.frames == (f,) and (segment.rows, segment.cols) == (2, 2)
        assert segment.time_span == (f / 2.0, f / 2.0 + 0.5) and segment.trailing == int(f == 4)
        cells = _patch_positions(processor.video_processor, video[f], 28).reshape(2, 2, 3)
        assert _check_cells(segment, lambda r, c, cells=cells: cells[r, c]) == 4
        assert abs(cells[..., 2].mean() - f / 4) < 0.01


def _internvl():
    return tiny_processor("internvl", tiny_tokenizer("internvl", ["cup"]))


@pytest.mark.parametrize("sizes", [[(301, 173)], [(173, 301)], [(97, 411), (64, 64)], [(100, 100)]])
def test_internvl_layout_matches_the_processor(sizes):
    from corelens.models.internvl import internvl_layout, tile_grid

    processor = _internvl()
    text = processor.apply_chat_template(messages(_sample_like(len(sizes))), add_generation_prompt=True)
    inputs = processor(text=[text], images=[position_image(*s) for s in sizes], return_tensors="pt")
    layout = internvl_layout(inputs["input_ids"], processor, sizes)
    ids = inputs["input_ids"][0]
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    assert not np.isin(
        ids[layout.visual].numpy(), [processor.start_image_token_id, processor.end_image_token_id]
    ).any()
    tiles = iter(inputs["pixel_values"])
    for i, size in enumerate(sizes):
        cols, rows, thumbnail = tile_grid(size, processor.image_processor)
        mine = [s for s in layout.segments if s.source == i]
        assert len(mine) == cols * rows + int(thumbnail)
        assert (mine[-1].view == "thumbnail") == thumbnail
        for segment in mine:  # token (r, c) of a tile = its 2 x 2 patches after pixel shuffle: 28 x 28 pixels
            cells = _patch_positions(processor.image_processor, next(tiles), 28).reshape(4, 4, 3)
            assert _check_cells(segment, lambda r, c, cells=cells: cells[r, c]) == 16


def test_internvl_token_order_through_the_model(tmp_path):
    """Changing the pixels under one token's cell changes that token's embedding only (real pixel shuffle)."""
    from transformers import AutoModelForImageTextToText

    path = build_tiny_checkpoint("internvl", tmp_path / "m", words=["cup"], layers=1, heads=2, kv_heads=1)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    model.model.vision_tower.encoder.layer = torch.nn.ModuleList()  # no attention: features stay local
    processor = _internvl()
    text = processor.apply_chat_template(messages(_sample_like(1)), add_generation_prompt=True)
    image = position_image(100, 100)
    pixels = processor(text=[text], images=[image], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        before = model.model.get_image_features(pixel_values=pixels).pooler_output[0]
        changed = pixels.clone()
        changed[0, :, 28:56, 56:84] += 1.0  # tile 0, token row 1, column 2
        after = model.model.get_image_features(pixel_values=changed).pooler_output[0]
    moved = ((after - before).abs().amax(-1) > 1e-6).nonzero().flatten().tolist()
    assert moved == [1 * 4 + 2]
