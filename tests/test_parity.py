"""Parity with the stock model: logits (sdpa) and RAM (eager attention weights), docs/methods.md#ram."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import skip_video
from helpers import noise_image

import corelens
from corelens.attention import RamProbe, activate
from corelens.data.sample import Sample, Target, Video
from corelens.models.prepare import prepare
from corelens.models.tiny import load_tiny


def _write(tmp_path, images):
    paths = []
    for i, im in enumerate(images):
        p = tmp_path / f"im{i}.png"
        im.save(p)
        paths.append(p)
    return paths


def make_sample(tmp_path, kind: str) -> Sample:
    """Return a sample with one image, three images (a document) or a 5-frame video, with targets."""
    if kind == "one":
        paths = _write(tmp_path, [noise_image(301, 173)])
        return Sample(
            "s1", "image", "what is the colour of the cup ?", images=tuple(paths), answer="red",
            targets=(Target("box", image=0, box=(40.0, 30.0, 150.0, 120.0)),), image_sizes=((301, 173),),
        )  # fmt: skip
    if kind == "several":
        sizes = [(120, 160), (173, 301), (64, 64)]
        paths = _write(tmp_path, [noise_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)])
        targets = (Target("image", image=1), Target("box", image=2, box=(0.0, 0.0, 20.0, 30.0)))
        return Sample(
            "s2", "document", "which page has the cup ?", images=tuple(paths), answer="2",
            targets=targets, image_sizes=tuple(sizes),
        )  # fmt: skip
    frames = _write(tmp_path, [noise_image(150, 90, seed=10 + f) for f in range(5)])
    tube = Target("tube", frames=(1, 2, 3), boxes=((0.0, 0.0, 40.0, 40.0),) * 3)
    return Sample(
        "s3", "video", "what is the colour of the cup ?", video=Video(tuple(frames), None, 2.0, None),
        answer="blue", targets=(tube,), frame_sizes=((150, 90),) * 5,
    )  # fmt: skip


def _eager_ram(eager_model, inputs, rows, omega, visual):
    with torch.no_grad():
        out = eager_model(**inputs, output_attentions=True, use_cache=False)
    mass, vis = [], []
    for att in out.attentions:
        a = att[0].double()[:, rows]  # (heads, rows, keys)
        mass.append(a[:, :, omega].sum(-1).mean(-1))
        vis.append(a[:, :, visual].sum(-1).mean(-1))
    return torch.stack(mass).numpy(), torch.stack(vis).numpy()


# The oracle below reads only token ids and the processor's grids; it shares no code with corelens.layout
# or prepare's row logic. (Omega of every family's box geometry: tests/test_omega_oracle.py.)


def _ids(inputs) -> np.ndarray:
    return inputs["input_ids"][0].numpy()


def _oracle_rows(m, sample, query: str, prompt_ids: np.ndarray, full_ids: np.ndarray) -> np.ndarray:
    """Question: the last occurrence of the question's own tokens; last: the last prompt id; answer: the ids
    after the longest common prefix of the prompt and the prompt + answer."""
    if query == "last":
        return np.array([len(prompt_ids) - 1])
    if query == "answer":
        same = prompt_ids == full_ids[: len(prompt_ids)]
        common = len(same) if same.all() else int(np.argmin(same))
        return np.arange(common, len(full_ids))
    needle = m.processor.tokenizer(sample.question, add_special_tokens=False)["input_ids"]
    windows = np.lib.stride_tricks.sliding_window_view(prompt_ids, len(needle))
    start = np.flatnonzero((windows == needle).all(1))[-1]
    return np.arange(start, start + len(needle))


def _visual_ids(m) -> set[int]:
    config = m.model.config
    names = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")
    return {int(getattr(config, n)) for n in names if getattr(config, n, None) is not None}


def _oracle_visual(m, ids: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.isin(ids, list(_visual_ids(m))))


def _cells_in_box(grid_h: int, grid_w: int, cell: int, size: tuple[int, int], box) -> np.ndarray:
    """Row-major indices of the cells whose original-pixel rectangle overlaps the box with positive area."""
    w, h = size
    sx, sy = grid_w * cell / w, grid_h * cell / h  # processed pixels per original pixel
    x0, y0, x1, y1 = box
    cols = [j for j in range(grid_w) if j * cell / sx < x1 and (j + 1) * cell / sx > x0]
    rows = [i for i in range(grid_h) if i * cell / sy < y1 and (i + 1) * cell / sy > y0]
    return np.array([i * grid_w + j for i in rows for j in cols], dtype=np.int64)


def _qwen_omega(m, sample, inputs) -> np.ndarray:
    """Omega from the image / video grids (t, h, w) in patches: merged cells in row-major order, each image's
    (t·h·w / merge²) image tokens in turn; a video's frame group g holds frames 2g and 2g + 1."""
    ids, vision = _ids(inputs), m.model.config.vision_config
    merge, patch, t_patch = vision.spatial_merge_size, vision.patch_size, vision.temporal_patch_size
    cell = merge * patch
    image_pos = np.flatnonzero(ids == m.model.config.image_token_id)
    video_pos = np.flatnonzero(ids == m.model.config.video_token_id)
    chunks, at = [], 0
    for t, gh, gw in inputs.get("image_grid_thw", torch.zeros(0, 3)).tolist():
        n = t * gh * gw // merge**2
        chunks.append((image_pos[at : at + n], gh // merge, gw // merge))
        at += n
    omega = []
    for target in sample.targets:
        if target.kind == "image":
            omega.append(chunks[target.image][0])
        elif target.kind == "box":
            pos, gh, gw = chunks[target.image]
            omega.append(pos[_cells_in_box(gh, gw, cell, sample.image_sizes[target.image], target.box)])
        else:  # a tube over video frames
            t, gh, gw = inputs["video_grid_thw"][0].tolist()
            per_group = gh * gw // merge**2
            for frame, box in zip(target.frames, target.boxes):
                group = video_pos[(frame // t_patch) * per_group : (frame // t_patch + 1) * per_group]
                hit = _cells_in_box(gh // merge, gw // merge, cell, sample.frame_sizes[frame], box)
                omega.append(group[hit])
    return np.unique(np.concatenate(omega))


@pytest.mark.parametrize("kind", ["one", "several", "video"])
@pytest.mark.parametrize("kv_heads", [2, 1])  # GQA groups of 2 and 4 query heads
def test_ram_equals_eager_attention(tiny_dir, family, kind, kv_heads, tmp_path):
    """The whole pipeline (prepare, layout, probe) against eager weights on rows and Omega from the oracle."""
    path = tiny_dir(family, kv_heads=kv_heads)
    m = corelens.load(path)
    eager, _ = load_tiny(path, attn_implementation="eager")
    sample = make_sample(tmp_path, kind)
    prompt = prepare(m, sample).inputs
    full = prepare(m, sample, answer=sample.answer).inputs
    for query in ("question", "last", "answer"):
        result = corelens.measure_sample(m, sample, query=query)
        inputs = full if query == "answer" else prompt
        rows = _oracle_rows(m, sample, query, _ids(prompt), _ids(full))
        omega, visual = _qwen_omega(m, sample, inputs), _oracle_visual(m, _ids(inputs))
        assert 0 < len(omega) < len(visual)
        ref_mass, ref_vis = _eager_ram(eager, inputs, rows, omega, visual)
        assert result.mass.shape == (2, 4)
        np.testing.assert_allclose(result.mass, ref_mass, atol=1e-5, rtol=0)
        np.testing.assert_allclose(result.share, ref_mass / ref_vis, atol=1e-5, rtol=1e-5)
        lift = ref_mass / ref_vis / (len(omega) / len(visual))
        np.testing.assert_allclose(result.lift, lift, atol=1e-5, rtol=1e-5)
        assert result.n_omega == len(omega) and result.n_visual == len(visual)


@pytest.mark.parametrize("kind", ["one", "several"])
def test_probe_and_rows_on_every_family(tiny_dir, any_family, kind, tmp_path):
    """Every family: query rows and V from the oracle; the probe against eager on an Omega drawn from V."""
    path = tiny_dir(any_family, kv_heads=1)
    m = corelens.load(path)
    eager, _ = load_tiny(path, attn_implementation="eager")
    sample = make_sample(tmp_path, kind)
    prepared = prepare(m, sample, answer=sample.answer)
    prompt_ids, full_ids = _ids(prepare(m, sample).inputs), _ids(prepared.inputs)
    visual = _oracle_visual(m, full_ids)
    np.testing.assert_array_equal(prepared.layout.visual, visual)
    omega = visual[np.random.default_rng(0).random(len(visual)) < 0.3]
    for query in ("question", "last", "answer"):
        rows = _oracle_rows(m, sample, query, prompt_ids, full_ids)
        np.testing.assert_array_equal(prepared.rows(query), rows)
        probe = RamProbe(2, 4, *(torch.from_numpy(a) for a in (rows, omega, visual)), len(full_ids))
        with torch.no_grad(), activate(m.layer_modules(), probe):
            m.model(**prepared.inputs, use_cache=False)
        ref_mass, ref_vis = _eager_ram(eager, prepared.inputs, rows, omega, visual)
        np.testing.assert_allclose(probe.mass.numpy(), ref_mass, atol=1e-5)
        np.testing.assert_allclose(probe.visual_mass.numpy(), ref_vis, atol=1e-5)


def test_ram_probe_with_padding_mask(tiny_dir, tmp_path):
    """A materialised (left-padding) mask reaches the probe rows exactly as eager applies it."""
    path = tiny_dir("qwen2_5_vl")
    m = corelens.load(path)
    eager, _ = load_tiny(path, attn_implementation="eager")
    sample = make_sample(tmp_path, "one")
    prepared = prepare(m, sample)
    inputs = dict(prepared.inputs)
    inputs["attention_mask"] = inputs["attention_mask"].clone()
    inputs["attention_mask"][0, :3] = 0  # the first three tokens become padding
    n = prepared.seq_len
    rows, omega, visual = (
        prepared.rows("question"),
        prepared.layout.omega(sample.targets),
        prepared.layout.visual,
    )
    probe = RamProbe(2, 4, torch.from_numpy(rows), torch.from_numpy(omega), torch.from_numpy(visual), n)
    with torch.no_grad(), activate(m.layer_modules(), probe):
        m.model(**inputs, use_cache=False)
    ref_mass, ref_vis = _eager_ram(eager, inputs, rows, omega, visual)
    np.testing.assert_allclose(probe.mass.numpy(), ref_mass, atol=1e-5)
    np.testing.assert_allclose(probe.visual_mass.numpy(), ref_vis, atol=1e-5)


@pytest.mark.parametrize("kind", ["one", "video"])
def test_logits_equal_stock_sdpa(tiny_dir, any_family, kind, tmp_path):
    skip_video(any_family, kind)
    path = tiny_dir(any_family)
    m = corelens.load(path)
    stock, _ = load_tiny(path)
    assert m.text_config._attn_implementation == "corelens"
    assert m.model.config.vision_config._attn_implementation == "sdpa"
    inputs = prepare(m, make_sample(tmp_path, kind)).inputs
    with torch.no_grad():
        ours = m.model(**inputs).logits
        ref = stock(**inputs).logits
    assert (ours - ref).abs().max().item() <= 1e-5
    gen = {"max_new_tokens": 6, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    a = m.model.generate(**inputs, **gen)
    b = stock.generate(**inputs, **gen)
    assert torch.equal(a.sequences, b.sequences)
    for sa, sb in zip(a.scores, b.scores):
        assert (sa - sb).abs().max().item() <= 1e-5


def test_hooks_are_scoped_to_their_model(tiny_dir, tmp_path):
    path = tiny_dir("qwen2_vl")
    m1, m2 = corelens.load(path), corelens.load(path)
    sample = make_sample(tmp_path, "one")
    p = prepare(m1, sample)
    rows = torch.from_numpy(p.rows("last"))
    probe = RamProbe(2, 4, rows, torch.tensor([5]), torch.tensor([5]), p.seq_len)
    with torch.no_grad(), activate(m1.layer_modules(), probe):
        m2.model(**p.inputs)
    assert torch.isnan(probe.mass).all()  # m2's forward never reached m1's probe
    with torch.no_grad(), activate(m1.layer_modules(), probe):
        m1.model(**p.inputs)
    assert not torch.isnan(probe.mass).any()


def test_unsupported_model_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(corelens.UnsupportedModelError, match="bert"):
        corelens.load(tmp_path)
    with pytest.raises(corelens.CorelensError, match="no such folder"):
        corelens.load(tmp_path / "nowhere")
