"""Omega against an independent oracle: the prompt positions whose input embeddings change when the pixels of
a box change, through the stock processor and model (issue 23).

The oracle shares no code with `corelens.layout`: a tiny checkpoint with a released checkpoint's vision
geometry (`tests/data/configs`) gets its vision attention made local (every attention output projection of
the vision tower zeroed, so a feature depends on its own patch only: patch merger, pixel shuffle, projector,
unpadding and bilinear resizing act as in the stock model); the pixels inside a box are changed; the
positions where the embeddings the language model receives differ are Omega. Boxes are drawn so that
their edges stay clear of every token boundary of the layout by the reach of the processor's resampling
(2 pixels of the larger of the original and processed grids, + 0.5): there the answer does not depend on how a resampling kernel leaks across a
boundary, and the layout must match the oracle exactly.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import CONFIGS, RELEASED, noise_image

import corelens
from corelens.data.sample import Sample, Target, Video
from corelens.layout import Segment
from corelens.models.families import FAMILIES as REGISTRY
from corelens.models.prepare import prepare
from corelens.models.tiny import build_released_checkpoint

# Processed pixels per cell side (before any bilinear resize of the feature grid): merged 2 x 2 patches for
# Qwen-VL, a patch for LLaVA, 2 x 2 patches after the pixel shuffle for InternVL.
CELL_PIXELS = {name: REGISTRY[name].cell_pixels for name in RELEASED}
BOXES_PER_CASE = 4
QUESTION = "what is the colour of the cup ?"


class _Stop(Exception):
    """Raised from the language model's pre-hook: the oracle needs its input embeddings only."""


@pytest.fixture(scope="module")
def released_model(tmp_path_factory):
    """Return family -> corelens-loaded tiny checkpoint with the released geometry, vision attention local."""
    made: dict[str, object] = {}

    def get(family: str):
        if family not in made:
            out = tmp_path_factory.mktemp(f"released-{family}")
            path = build_released_checkpoint(
                CONFIGS / RELEASED[family], out, words=["cup"], layers=1, heads=2, kv_heads=1
            )
            m = corelens.load(path)
            _make_vision_local(m.model)
            made[family] = m
        return made[family]

    return get


def _make_vision_local(model: torch.nn.Module) -> None:
    """Zero every attention output projection of the vision tower: each feature then sees its own patch only."""
    tower = getattr(model.model, "visual", None) or model.model.vision_tower
    pattern = re.compile(r"(attn|attention|self_attn)\.(proj|out_proj|projection_layer|o_proj)$")
    zeroed = 0
    for name, module in tower.named_modules():
        if isinstance(module, torch.nn.Linear) and pattern.search(name):
            torch.nn.init.zeros_(module.weight)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
            zeroed += 1
    assert zeroed, "no attention output projection found in the vision tower"


def _input_embeddings(m, inputs: dict) -> torch.Tensor:
    """Return the embeddings the language model receives for `inputs` (the stock model's own merge)."""
    captured = {}

    def hook(_module, args, kwargs):
        captured["embeds"] = kwargs.get("inputs_embeds", args[0] if args else None)
        raise _Stop

    handle = m.model.model.language_model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            m.model(**inputs)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured["embeds"][0].double()


def _changed(before: torch.Tensor, after: torch.Tensor) -> np.ndarray:
    """Return the positions whose embedding changed."""
    return np.flatnonzero(((after - before).abs().amax(-1) > 1e-6).numpy())


def _perturbed(image, box: tuple[int, int, int, int]):
    """Return `image` with every pixel inside `box` (integer edges, x1 / y1 exclusive) changed by 128 levels."""
    x0, y0, x1, y1 = box
    pixels = np.asarray(image).copy()
    pixels[y0:y1, x0:x1] = (pixels[y0:y1, x0:x1].astype(np.int16) + 128) % 256
    from PIL import Image

    return Image.fromarray(pixels.astype(np.uint8))


def _boundaries(segments: list[Segment], axis: int, cell_pixels: int) -> tuple[np.ndarray, float]:
    """Return every cell edge (original pixels) of `segments` along x (0) or y (1) and the resampling margin."""
    edges, margin = [], 0.0
    for seg in segments:
        spans = seg.cell_spans()[axis]
        edges.append(spans.ravel())
        # Original pixels per processed pixel, from the finest cell of the segment. A bicubic resize reaches
        # 2 pixels of the larger grid on either side (2 processed pixels when shrinking, 2 original ones
        # when enlarging); half a pixel more for rounding.
        per_processed = float(np.min(spans[:, 1] - spans[:, 0])) / cell_pixels
        margin = max(margin, 2.0 * max(per_processed, 1.0) + 0.5)
    return np.concatenate(edges), margin


def _clear_positions(size: int, edges: np.ndarray, margin: float) -> np.ndarray:
    """Return the integer coordinates in [0, size] at least `margin` away from every edge."""
    grid = np.arange(size + 1, dtype=np.float64)
    distance = np.abs(grid[:, None] - edges[None, :]).min(axis=1)
    return grid[distance >= margin].astype(int)


def _boxes(segments: list[Segment], size: tuple[int, int], family: str, rng, n: int) -> list[tuple]:
    """Draw `n` boxes inside the image whose edges avoid every token boundary of `segments`."""
    xs = _clear_positions(size[0], *_boundaries(segments, 0, CELL_PIXELS[family]))
    ys = _clear_positions(size[1], *_boundaries(segments, 1, CELL_PIXELS[family]))
    assert len(xs) >= 2 and len(ys) >= 2, "no box edge clears the token boundaries"
    boxes = []
    while len(boxes) < n:
        x0, x1 = sorted(rng.choice(xs, 2, replace=False))
        y0, y1 = sorted(rng.choice(ys, 2, replace=False))
        boxes.append((int(x0), int(y0), int(x1), int(y1)))
    return boxes


def _write(images, folder, stem: str):
    paths = []
    for i, image in enumerate(images):
        paths.append(folder / f"{stem}-{i}.png")
        image.save(paths[-1], compress_level=0)  # stored, not deflated: the same pixels, half the time
    return tuple(paths)


def _sample(kind: str, paths: tuple, sizes) -> Sample:
    if kind == "video":
        return Sample("v", "video", QUESTION, video=Video(paths, None, 2.0, None), frame_sizes=tuple(sizes))
    return Sample("i", "image", QUESTION, images=paths, image_sizes=tuple(sizes))


CASES = {
    "landscape": ("image", [(301, 173)], 0),
    "portrait": ("image", [(173, 301)], 0),
    "multi-image": ("image", [(150, 90), (300, 420)], 1),
    "video": ("video", [(150, 90)] * 5, 2),
    # Many tiles: InternVL 3 x 2 + thumbnail, LLaVA-NeXT 2 x 2, OneVision 6 x 4 downsampled to fit 9 tiles.
    "large": ("image", [(2000, 1400)], 0),
    # A long strip: LLaVA-NeXT's 336 x 1008 pinpoint (3 x 1 tiles), InternVL's wide tile grids.
    "panorama": ("image", [(1000, 300)], 0),
}
FAMILIES = tuple(RELEASED)


def _oracle_case(m, family: str, kind: str, sizes, which: int, tmp_path, seed: int, n_boxes: int):
    """Yield (box, oracle Omega, layout, target) for `n_boxes` boxes in image / frame `which`."""
    rng = np.random.default_rng(seed)
    originals = [noise_image(w, h, seed=seed + i) for i, (w, h) in enumerate(sizes)]
    sample = _sample(kind, _write(originals, tmp_path, "orig"), sizes)
    prepared = prepare(m, sample)
    layout = prepared.layout
    before = _input_embeddings(m, prepared.inputs)
    if kind == "video":
        segments = [s for s in layout.segments if s.kind == "video" and which in s.frames]
    else:
        segments = layout.of("image", which)
    for b, box in enumerate(_boxes(segments, sizes[which], family, rng, n_boxes)):
        changed = list(originals)
        changed[which] = _perturbed(originals[which], box)
        after_sample = _sample(kind, _write(changed, tmp_path, f"box{b}"), sizes)
        after_prepared = prepare(m, after_sample)
        assert torch.equal(after_prepared.inputs["input_ids"], prepared.inputs["input_ids"])
        oracle = _changed(before, _input_embeddings(m, after_prepared.inputs))
        if kind == "video":
            target = Target("tube", frames=(which,), boxes=(tuple(float(v) for v in box),))
        else:
            target = Target("box", image=which, box=tuple(float(v) for v in box))
        yield box, oracle, layout, target


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_omega_equals_the_oracle(released_model, family, case, tmp_path):
    kind, sizes, which = CASES[case]
    if kind == "video" and not REGISTRY[family].video:
        pytest.skip(f"{family} takes images only")
    m = released_model(family)
    seen = 0
    cases = _oracle_case(m, family, kind, sizes, which, tmp_path, 7, BOXES_PER_CASE)
    for box, oracle, layout, target in cases:
        omega = layout.omega([target])
        assert omega.tolist() == oracle.tolist(), (family, case, box, sorted(set(omega) ^ set(oracle)))
        seen += len(oracle) > 0
    # Boxes that reach tokens: all of them, but for LLaVA-1.5, whose centre crop cuts away part of the image.
    assert seen >= (1 if family == "llava" else BOXES_PER_CASE)


def _uniform(segment: Segment) -> Segment:
    """Return `segment` with its cells split evenly over its region (no patch spacing, no footprints)."""
    xs, ys = segment.cell_spans()
    region = (float(xs[0, 0]), float(ys[0, 0]), float(xs[-1, 1]), float(ys[-1, 1]))
    return replace(segment, col_spans=None, row_spans=None, region=region)


def _feature_level_cases(m, case: str, tmp_path, n: int, seed: int):
    """Yield (oracle, layout, target) for `n` boxes with arbitrary integer edges in processed-pixel space.

    The pixels are changed in the processed input itself (`pixel_values`), inside a box of the 384-pixel
    video frame or of the any-res canvas, so no processor resampling blurs the box edge: the only resampling
    left is the model's own bilinear resize of features. The box is mapped back to original pixels with
    transformers' own canvas rules (`select_best_resolution`, `get_patch_output_size`, centred paste).
    """
    from transformers.image_processing_utils import get_patch_output_size, select_best_resolution

    rng = np.random.default_rng(seed)
    kind, sizes, which = CASES[case]
    w, h = sizes[which]
    images = [noise_image(*size, seed=seed + i) for i, size in enumerate(sizes)]
    prepared = prepare(m, _sample(kind, _write(images, tmp_path, "orig"), sizes))
    before = _input_embeddings(m, prepared.inputs)
    tile = m.model.config.vision_config.image_size
    if kind == "video":
        canvas_w = canvas_h = tile
        paste_x = paste_y = 0
        new_w, new_h = tile, tile
    else:
        canvas_h, canvas_w = select_best_resolution((h, w), m.processor.image_processor.image_grid_pinpoints)
        new_h, new_w = get_patch_output_size(np.zeros((h, w, 3)), (canvas_h, canvas_w), "channels_last")
        paste_x, paste_y = (canvas_w - new_w) // 2, (canvas_h - new_h) // 2
    for _ in range(n):
        x0, x1 = sorted(rng.choice(np.arange(paste_x, paste_x + new_w + 1), 2, replace=False))
        y0, y1 = sorted(rng.choice(np.arange(paste_y, paste_y + new_h + 1), 2, replace=False))
        inputs = dict(prepared.inputs)
        if kind == "video":
            pv = inputs["pixel_values_videos"].clone()
            pv[0, which, :, y0:y1, x0:x1] += 1.0
            inputs["pixel_values_videos"] = pv
        else:
            pv = inputs["pixel_values"].clone()
            for ty in range(canvas_h // tile):
                for tx in range(canvas_w // tile):
                    k = 1 + ty * (canvas_w // tile) + tx  # tile 0 is the base view
                    ox, oy = tx * tile, ty * tile
                    lx0, lx1 = max(x0 - ox, 0), min(x1 - ox, tile)
                    ly0, ly1 = max(y0 - oy, 0), min(y1 - oy, tile)
                    if lx0 < lx1 and ly0 < ly1:
                        pv[0, k, :, ly0:ly1, lx0:lx1] += 1.0
            inputs["pixel_values"] = pv
        oracle = _changed(before, _input_embeddings(m, inputs))
        sx, sy = w / new_w, h / new_h
        box = ((x0 - paste_x) * sx, (y0 - paste_y) * sy, (x1 - paste_x) * sx, (y1 - paste_y) * sy)
        if kind == "video":
            target = Target("tube", frames=(which,), boxes=(box,))
        else:
            target = Target("box", image=which, box=box)
        yield oracle, prepared.layout, target


# Measured by the test below (seed 11, 30 boxes per case); docs/families.md quotes these figures.
UNIFORM_DISAGREEMENT = {"large": 14, "video": 16}


@pytest.mark.parametrize("case", ["large", "video"])
def test_bilinear_footprints_match_the_oracle_at_any_box_edge(released_model, case, tmp_path):
    """OneVision resizes features bilinearly (grid downsampling, video pooling). Omega through the resampling
    footprint equals the oracle for boxes with arbitrary edges; the same cells split evenly over the region
    (the uniform grid) disagree with it near box edges, on the share of boxes recorded here."""
    m = released_model("llava_onevision")
    n, differ, tokens, sizes = 30, 0, [], []
    for oracle, layout, target in _feature_level_cases(m, case, tmp_path, n, 11):
        resized = [s for s in layout.segments if s.view == "grid" or s.kind == "video"]
        assert resized and all(s.col_spans is not None for s in resized)
        # Only the resized grids saw the changed pixels (the base view was left as it was).
        shown = np.concatenate([s.all_tokens() for s in resized])
        assert np.intersect1d(layout.omega([target]), shown).tolist() == oracle.tolist(), target
        uniform = replace(layout, segments=tuple(_uniform(s) if s in resized else s for s in layout.segments))
        mismatch = set(np.intersect1d(uniform.omega([target]), shown).tolist()) ^ set(oracle.tolist())
        differ += bool(mismatch)
        tokens.append(len(mismatch))
        sizes.append(len(oracle))
    print(
        f"{case}: the uniform grid differs from the oracle on {differ} of {n} boxes "
        f"(mean {np.mean(tokens):.1f} tokens of a mean |Omega| of {np.mean(sizes):.1f})"
    )
    assert differ == UNIFORM_DISAGREEMENT[case]


@pytest.mark.parametrize("padding", ["visual", "omega", "none"])
def test_padding_cells_against_the_oracle(released_model, padding, tmp_path):
    """OneVision's multi-image squares: a whole-image target against the positions that change when every
    pixel of the image changes. Default rule: Omega = the oracle, padding cells stay in V."""
    m = released_model("llava_onevision")
    sizes = [(150, 90), (120, 360)]  # image 1 padded to 360 x 360: its left and right thirds are padding
    originals = [noise_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    sample = _sample("image", _write(originals, tmp_path, "orig"), sizes)
    prepared = prepare(m, sample, padding=padding)
    changed = [originals[0], _perturbed(originals[1], (0, 0, *sizes[1]))]
    after = prepare(m, _sample("image", _write(changed, tmp_path, "all"), sizes), padding=padding)
    oracle = set(_changed(_input_embeddings(m, prepared.inputs), _input_embeddings(m, after.inputs)).tolist())
    layout = prepared.layout
    (segment,) = layout.of("image", 1)
    cells = set(segment.pixel_tokens().tolist())
    padding_cells = cells - oracle
    assert padding_cells and len(padding_cells) == int(segment.padding_cells().sum())
    omega = set(layout.omega([Target("image", image=1)]).tolist())
    visual = set(layout.visual.tolist())
    if padding == "omega":
        assert omega == cells  # padding cells too
    else:
        assert omega == oracle
    assert (padding_cells <= visual) == (padding != "none")
    assert segment.end - 1 in visual  # the pixel-less newline after the image stays in V under every rule
