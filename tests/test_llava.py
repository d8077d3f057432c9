"""LLaVA-1.5: the layout against the real processor (centre crop and pad-to-square), images only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import position_image, released_geometry, released_processor

import corelens
from corelens.data.sample import Sample, Target, Video
from corelens.errors import UnsupportedModelError
from corelens.models.families.internvl import TILE as INTERNVL_TILE
from corelens.models.families.llava.tokens import grid_region, llava_layout
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


def _llava(geometry: str):
    """LLaVA-1.5's processor: tiny 56-pixel crops (with or without pad-to-square), or llava-1.5-7b-hf's."""
    if geometry == "released":
        return released_processor("llava")
    return tiny_processor("llava", tiny_tokenizer("llava", ["cup"]), pad=geometry == "tiny-pad")


@pytest.mark.parametrize("geometry", ["tiny", "tiny-pad", "released"])
@pytest.mark.parametrize("sizes", SIZES)
def test_layout_matches_the_processor(sizes, geometry):
    processor = _llava(geometry)
    images = [position_image(w, h) for w, h in sizes]
    text = processor.apply_chat_template(messages(_sample_like(len(images))), add_generation_prompt=True)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    layout = llava_layout(inputs["input_ids"], processor, sizes)
    ids = inputs["input_ids"][0]
    assert (ids[layout.visual] == processor.image_token_id).all()
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    inside = 0
    crop = processor.image_processor.crop_size["height"]
    for i, segment in enumerate(layout.segments):
        assert segment.source == i and (segment.rows, segment.cols) == (crop // 14, crop // 14)
        rgb = _patch_positions(processor.image_processor, inputs["pixel_values"][i], processor.patch_size)
        inside += _check_cells(segment, lambda r, c, rgb=rgb, n=segment.cols: rgb[r * n + c])
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
    """Assert each in-image cell's decoded position is its centre; return how many cells were checked.

    The tolerance, a quarter cell + 1 pixel, is below the 5.8 pixels by which cells spaced at tile / count
    (instead of the patch size) miss at the far edge of a 384-pixel SigLIP tile.
    """
    xs, ys = segment.cell_spans()
    w, h = segment.orig_size
    checked = 0
    for r in range(segment.rows):
        for c in range(segment.cols):
            cx, cy = xs[c].mean(), ys[r].mean()
            if xs[c, 0] < -0.5 or xs[c, 1] > w + 0.5 or ys[r, 0] < -0.5 or ys[r, 1] > h + 0.5:
                continue  # a cell that shows padding too: its decoded mean mixes in the padding colour
            x, y = rgb_of_cell(r, c)[:2] * (w, h)
            assert abs(x - cx) < 0.25 * (xs[c, 1] - xs[c, 0]) + 1.0, (segment.view, r, c, x, cx)
            assert abs(y - cy) < 0.25 * (ys[r, 1] - ys[r, 0]) + 1.0, (segment.view, r, c, y, cy)
            checked += 1
    return checked


def _processor(family: str, geometry: str):
    """Return (processor, tile, patch): the tiny 56-pixel geometry or the released checkpoint's."""
    if geometry == "released":
        g = released_geometry(family)
        return released_processor(family), g["tile"], g["patch"]
    return (
        tiny_processor(family, tiny_tokenizer(family, ["cup"])),
        INTERNVL_TILE if family == "internvl" else 56,
        14,
    )


@pytest.mark.parametrize("geometry", ["tiny", "released"])
@pytest.mark.parametrize("sizes", [[(301, 173)], [(173, 301)], [(97, 411), (64, 64)], [(120, 100)]])
def test_llava_next_layout_matches_the_processor(sizes, geometry):
    from corelens.models.families.llava_next.tokens import llava_next_layout

    processor, tile, patch = _processor("llava_next", geometry)
    per = tile // patch
    images = [position_image(w, h) for w, h in sizes]
    text = processor.apply_chat_template(messages(_sample_like(len(images))), add_generation_prompt=True)
    inputs = processor(text=[text], images=images, return_tensors="pt")
    layout = llava_next_layout(inputs["input_ids"], processor, tile, sizes, patch=patch)
    ids = inputs["input_ids"][0]
    assert (ids[layout.visual] == processor.image_token_id).all()
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    ip, patch = processor.image_processor, processor.patch_size
    for i in range(len(sizes)):
        base, grid = layout.segments[2 * i : 2 * i + 2]
        assert (base.view, grid.view, grid.row_newline) == ("base", "grid", True)
        tiles = [_patch_positions(ip, t, patch).reshape(per, per, 3) for t in inputs["pixel_values"][i]]
        assert _check_cells(base, lambda r, c, t=tiles[0]: t[r, c]) == per * per
        # Grid cell (r, c) is feature (r + r0, c + c0) of the stitched tiles; r0 / c0: rows / columns unpadded.
        best_h, best_w = select_best(sizes[i], ip.image_grid_pinpoints)
        per_row = best_w // tile
        r0 = ((best_h // tile) * per - grid.rows) // 2
        c0 = (per_row * per - grid.cols) // 2

        def cell(r, c, tiles=tiles, r0=r0, c0=c0, per_row=per_row):
            fr, fc = r + r0, c + c0
            return tiles[1 + (fr // per) * per_row + fc // per][fr % per, fc % per]

        assert _check_cells(grid, cell) >= min(grid.rows * grid.cols, 4)


def select_best(size, pinpoints):
    from transformers.image_processing_utils import select_best_resolution

    return select_best_resolution((size[1], size[0]), pinpoints)


def _bilinear(values: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Resize an (h, w, 3) map bilinearly like the model (torch interpolate, align_corners=False)."""
    t = torch.from_numpy(values).permute(2, 0, 1)[None]
    return torch.nn.functional.interpolate(t, [rows, cols], mode="bilinear")[0].permute(1, 2, 0).numpy()


def _inside(segment, rgb_of_cell) -> int:
    """Assert each cell's decoded position lies in its span (bilinearly resized grids); return the count.

    Cells whose footprint reaches into padding are skipped (their decoded mean mixes in the padding colour).
    """
    xs, ys = segment.cell_spans()
    w, h = segment.orig_size
    checked = 0
    for r in range(segment.rows):
        for c in range(segment.cols):
            if xs[c, 0] < -0.5 or xs[c, 1] > w + 0.5 or ys[r, 0] < -0.5 or ys[r, 1] > h + 0.5:
                continue
            x, y = rgb_of_cell(r, c)[:2] * (w, h)
            assert xs[c, 0] - 1.0 <= x <= xs[c, 1] + 1.0, (segment.view, r, c, x, xs[c])
            assert ys[r, 0] - 1.0 <= y <= ys[r, 1] + 1.0, (segment.view, r, c, y, ys[r])
            checked += 1
    return checked


# 76 px: one 384 tile whose last 6 pixels (1.2 original pixels) reach no patch; 1000 x 700: downsampled grid.
@pytest.mark.parametrize("geometry", ["tiny", "released"])
@pytest.mark.parametrize("size", [(301, 173), (120, 100), (56, 150), (173, 301), (76, 76), (1000, 700)])
def test_onevision_single_image_layout(size, geometry):
    from corelens.models.families.llava_next.tokens import anyres_grid
    from corelens.models.families.llava_onevision.tokens import onevision_layout

    processor, tile, patch = _processor("llava_onevision", geometry)
    per = tile // patch
    text = processor.apply_chat_template(messages(_sample_like(1)), add_generation_prompt=True)
    inputs = processor(text=[text], images=[position_image(*size)], return_tensors="pt")
    layout = onevision_layout(inputs["input_ids"], processor, tile, [size], patch=patch)
    ids = inputs["input_ids"][0]
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual)
    base, grid = layout.segments
    ip = processor.image_processor
    tiles = [
        _patch_positions(ip, t[:, : per * patch, : per * patch], patch) for t in inputs["pixel_values"][0]
    ]
    tiles = [t.reshape(per, per, 3) for t in tiles]
    assert _check_cells(base, lambda r, c: tiles[0][r, c]) == per * per
    xs, ys, region = anyres_grid(size, processor, tile, patch)
    rows, cols = len(ys), len(xs)
    assert grid.region == region and grid.row_newline
    best_h, best_w = select_best(size, ip.image_grid_pinpoints)
    per_row = best_w // tile
    r0, c0 = ((best_h // tile) * per - rows) // 2, (per_row * per - cols) // 2
    stitched = np.stack(
        [
            np.concatenate([tiles[1 + tr * per_row + tc][fr] for tc in range(per_row)], axis=0)
            for tr in range(best_h // tile)
            for fr in range(per)
        ]
    )[r0 : r0 + rows, c0 : c0 + cols]
    if (grid.rows, grid.cols) == (rows, cols):  # not downsampled: every cell is one feature of the tiles
        assert _check_cells(grid, lambda r, c: stitched[r, c]) >= 4
    else:  # resized bilinearly: each decoded position lies inside the cell's footprint
        assert grid.rows < rows and grid.cols < cols
        resized = _bilinear(stitched, grid.rows, grid.cols)
        assert _inside(grid, lambda r, c: resized[r, c]) >= grid.rows * grid.cols // 2


def test_onevision_cells_follow_the_patch_size_not_tile_over_count():
    """SigLIP-so400m-patch14-384: 27 patches of 14 pixels cover 378 of 384 pixels (issue: 14.22 spacing)."""
    from corelens.models.families.llava_onevision.tokens import onevision_layout

    processor, tile, patch = _processor("llava_onevision", "released")
    text = processor.apply_chat_template(messages(_sample_like(1)), add_generation_prompt=True)
    inputs = processor(text=[text], images=[position_image(384, 384)], return_tensors="pt")
    base = onevision_layout(inputs["input_ids"], processor, tile, [(384, 384)], patch=patch).segments[0]
    xs, _ = base.cell_spans()
    assert xs[0].tolist() == [0.0, 14.0] and xs[-1].tolist() == [364.0, 378.0]
    # A box over the last 6 pixels of the tile reaches no token.
    assert len(base.tokens_in_box((379.0, 0.0, 384.0, 384.0))) == 0


@pytest.mark.parametrize("geometry", ["tiny", "released"])
def test_onevision_several_images_are_padded_squares_with_a_newline(geometry):
    from corelens.models.families.llava_onevision.tokens import onevision_layout

    processor, tile, patch = _processor("llava_onevision", geometry)
    per = tile // patch
    sizes = [(301, 173), (64, 64)]
    text = processor.apply_chat_template(messages(_sample_like(2)), add_generation_prompt=True)
    # One prompt's images as one nested list: OneVision's multi-image mode (per-image anyres is off).
    inputs = processor(text=[text], images=[[position_image(*s) for s in sizes]], return_tensors="pt")
    layout = onevision_layout(inputs["input_ids"], processor, tile, sizes, patch=patch)
    ids = inputs["input_ids"][0]
    assert int((ids == processor.image_token_id).sum()) == len(layout.visual) == 2 * (per * per + 1)
    for i, segment in enumerate(layout.segments):
        assert segment.trailing == 1 and (segment.rows, segment.cols) == (per, per)
        pv = inputs["pixel_values"][i][0][:, : per * patch, : per * patch]
        cells = _patch_positions(processor.image_processor, pv, patch).reshape(per, per, 3)
        assert _check_cells(segment, lambda r, c, cells=cells: cells[r, c]) >= 8


@pytest.mark.parametrize("geometry", ["tiny", "released"])
def test_onevision_video_frames_are_pooled_with_one_newline(geometry):
    from corelens.models.families.llava_onevision.tokens import onevision_layout

    processor, tile, patch = _processor("llava_onevision", geometry)
    per = tile // patch
    pooled = -(-per // 2)
    frames = [position_image(150, 90, frame=f / 4) for f in range(5)]
    sample = _sample_like(0)
    sample.video = object()
    text = processor.apply_chat_template(messages(sample), add_generation_prompt=True)
    inputs = processor(text=[text], videos=[frames], return_tensors="pt")
    times = [f / 2.0 for f in range(5)]
    layout = onevision_layout(inputs["input_ids"], processor, tile, [], (150, 90), times, patch=patch)
    ids = inputs["input_ids"][0]
    assert int((ids == processor.video_token_id).sum()) == len(layout.visual) == 5 * pooled**2 + 1
    video = inputs["pixel_values_videos"][0]
    for f, segment in enumerate(layout.segments):
        assert segment.frames == (f,) and (segment.rows, segment.cols) == (pooled, pooled)
        assert segment.time_span == (f / 2.0, f / 2.0 + 0.5) and segment.trailing == int(f == 4)
        feats = _patch_positions(processor.video_processor, video[f][:, : per * patch, : per * patch], patch)
        cells = _bilinear(feats.reshape(per, per, 3), pooled, pooled)  # the model's apply_pooling
        assert _inside(segment, lambda r, c, cells=cells: cells[r, c]) == pooled**2
        assert abs(cells[..., 2].mean() - f / 4) < 0.01


@pytest.mark.parametrize("geometry", ["tiny", "released"])
@pytest.mark.parametrize("sizes", [[(301, 173)], [(173, 301)], [(97, 411), (64, 64)], [(100, 100)]])
def test_internvl_layout_matches_the_processor(sizes, geometry):
    from corelens.models.families.internvl.tokens import internvl_layout, tile_grid

    processor, tile, _ = _processor("internvl", geometry)
    side = int(processor.image_seq_length**0.5)  # tokens per tile side after the pixel shuffle
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
        cols, rows, thumbnail = tile_grid(size, processor)
        mine = [s for s in layout.segments if s.source == i]
        assert len(mine) == cols * rows + int(thumbnail)
        assert (mine[-1].view == "thumbnail") == thumbnail
        for segment in mine:  # token (r, c) of a tile = its 2 x 2 patches after pixel shuffle
            cells = _patch_positions(processor.image_processor, next(tiles), tile // side)
            cells = cells.reshape(side, side, 3)
            assert _check_cells(segment, lambda r, c, cells=cells: cells[r, c]) == side * side


def test_internvl_tiles_as_its_processor_does_not_as_its_image_processor_stores():
    """InternVL3-8B-hf stores crop_to_patches = false; InternVLProcessor tiles by default (issue 23)."""
    from corelens.models.families.internvl.tokens import tile_grid

    processor = released_processor("internvl")
    assert processor.image_processor.crop_to_patches is False
    assert tile_grid((1000, 500), processor) == (2, 1, True)
    inputs = processor(text=["<IMG_CONTEXT>"], images=[position_image(1000, 500)], return_tensors="pt")
    assert len(inputs["pixel_values"]) == 3  # 2 x 1 tiles + thumbnail: what the layout says


def test_internvl_token_order_through_the_model(tmp_path):
    """Changing the pixels under one token's cell changes that token's embedding only (real pixel shuffle)."""
    from transformers import AutoModelForImageTextToText

    path = build_tiny_checkpoint("internvl", tmp_path / "m", words=["cup"], layers=1, heads=2, kv_heads=1)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    model.model.vision_tower.encoder.layer = torch.nn.ModuleList()  # no attention: features stay local
    processor, _, _ = _processor("internvl", "tiny")
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


def test_padding_rule_reaches_ram(tmp_path):
    """`measure_sample(..., padding=...)` (`corelens rank --padding`): LLaVA-1.5 with pad-to-square."""
    from corelens.experiments.rank import measure_sample

    path = build_tiny_checkpoint(
        "llava", tmp_path / "m", words=["cup"], layers=1, heads=2, kv_heads=1, processor_kwargs={"pad": True}
    )
    m = corelens.load(path)
    image = tmp_path / "tall.png"
    position_image(60, 200).save(
        image
    )  # padded to 200 x 200: the outer columns of the 4 x 4 grid are padding
    whole = (Target("image", image=0),)
    sample = Sample(
        "t",
        "image",
        "what is the colour of the cup ?",
        images=(image,),
        image_sizes=((60, 200),),
        targets=whole,
    )
    visual, omega, none = (measure_sample(m, sample, padding=p) for p in ("visual", "omega", "none"))
    assert (visual.n_omega, visual.n_visual) == (8, 16)
    assert (omega.n_omega, omega.n_visual) == (16, 16)
    assert (none.n_omega, none.n_visual) == (8, 8)
    assert np.allclose(visual.mass, none.mass) and np.all(omega.mass >= visual.mass)


@pytest.mark.parametrize("family", ["internvl", "llava"])
def test_processor_geometry_that_disagrees_with_the_tower_is_refused(tmp_path, family):
    path = build_tiny_checkpoint(family, tmp_path / "m", words=["cup"], layers=1, heads=2, kv_heads=1)
    m = corelens.load(path)
    image = tmp_path / "a.png"
    position_image(120, 100).save(image)
    sample = Sample(
        "g", "image", "what is the colour of the cup ?", images=(image,), image_sizes=((120, 100),)
    )
    prepare(m, sample)  # consistent: fine
    if family == "internvl":
        m.processor.image_seq_length = 64  # 8 x 8 tokens per tile; the tower gives 4 x 4
        match = "image_seq_length = 64 disagrees with the vision tower's 16"
    else:
        m.processor.patch_size = 28
        match = "patch_size = 28 disagrees"
    with pytest.raises(UnsupportedModelError, match=match):
        prepare(m, sample)
