"""Parity with the stock model: logits (sdpa) and RAM (eager attention weights), METHODS §2."""

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


@pytest.mark.parametrize("kind", ["one", "several", "video"])
@pytest.mark.parametrize("kv_heads", [2, 1])  # GQA groups of 2 and 4 query heads
def test_ram_equals_eager_attention(tiny_dir, any_family, kind, kv_heads, tmp_path):
    skip_video(any_family, kind)
    path = tiny_dir(any_family, kv_heads=kv_heads)
    m = corelens.load(path)
    eager, _ = load_tiny(path, attn_implementation="eager")
    sample = make_sample(tmp_path, kind)
    for query in ("question", "last", "answer"):
        result = corelens.measure_sample(m, sample, query=query)
        prepared = prepare(m, sample, answer=sample.answer if query == "answer" else None)
        omega = prepared.layout.omega(sample.targets)
        visual = prepared.layout.visual
        ref_mass, ref_vis = _eager_ram(eager, prepared.inputs, prepared.rows(query), omega, visual)
        assert result.mass.shape == (2, 4)
        np.testing.assert_allclose(result.mass, ref_mass, atol=1e-5, rtol=0)
        np.testing.assert_allclose(result.share, ref_mass / ref_vis, atol=1e-5, rtol=1e-5)
        lift = ref_mass / ref_vis / (len(omega) / len(visual))
        np.testing.assert_allclose(result.lift, lift, atol=1e-5, rtol=1e-5)
        assert result.n_omega == len(omega) and result.n_visual == len(visual)


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
