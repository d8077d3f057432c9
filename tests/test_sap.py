"""SAP (docs/methods.md#sap): the prior hook, its conventions, the priors, the key-region ratio and `corelens sap`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import corelens
from corelens.attention import activate, row_probabilities
from corelens.attention.dispatch import AttentionHook
from corelens.attention.priors import SapHook, parse_heads, parse_layers, rebuild_rows
from corelens.attention.probes import row_scores
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.cli import main
from corelens.errors import CorelensError
from corelens.experiments.sap import build_prior, key_region, prior_vis_attn, sap
from corelens.models.prepare import prepare
from corelens.models.tiny import load_tiny
from corelens.organism.tasks import generate


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("sap-data")
    return {task: generate(task, root / task, 2, seed=9) for task in ("image", "video", "document")}


def _sample(path, i: int = 0):
    return corelens.read_samples(path)[0][i]


class _Rows(AttentionHook):
    def __init__(self):
        self.pairs = []

    def pre(self, call):
        rows = torch.tensor([call.query.shape[2] - 1, 2])
        self.pairs.append((torch.softmax(row_scores(call, rows), -1), row_probabilities(call, rows)))


def test_named_sets():
    assert parse_layers("all", 4) == (0, 1, 2, 3)
    assert parse_layers("late", 28) == tuple(range(19, 28)) and parse_layers("early", 3) == (0,)
    assert parse_layers("21-27", 28) == tuple(range(21, 28)) and parse_layers("0,2-3", 4) == (0, 2, 3)
    assert parse_layers("last:2", 28) == (26, 27) and parse_layers("first:1", 4) == (0,)
    for bad in ("5", "2-1", "x", "last:0", "last:9"):
        with pytest.raises(CorelensError):
            parse_layers(bad, 4)
    assert parse_heads("1,3", 4).select(torch.zeros(4)).tolist() == [False, True, False, True]
    band = parse_heads("band:50-100", 4).select(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    assert band.tolist() == [False, True, False, True]
    with pytest.raises(CorelensError):
        parse_heads("band:80-20", 4)


def test_conventions_on_one_row():
    scores = torch.tensor([[[[2.0, 0.5, -1.0, 1.0, float("-inf")]]]])  # keys 1, 2 are visual; key 4 masked
    visual = torch.tensor([1, 2])
    prior = torch.tensor([0.25, 0.75])
    probs = torch.softmax(scores, -1)
    mass = rebuild_rows(scores, visual, prior, "mass")[0, 0, 0]
    m = probs[0, 0, 0, visual].sum()
    torch.testing.assert_close(mass[visual], m * prior)
    torch.testing.assert_close(mass[[0, 3, 4]], probs[0, 0, 0, [0, 3, 4]])
    logits = rebuild_rows(scores, visual, prior, "logits")[0, 0, 0]
    torch.testing.assert_close(logits, torch.softmax(torch.tensor([2.0, 0.25, 0.75, 1.0, float("-inf")]), -1))
    mean = rebuild_rows(scores, visual, prior, "mean_logits")[0, 0, 0]
    # m = mean(s_V) = -0.25 < 0: m + |m| (|V| π - 1) = -0.25 + 0.25 * ([0.5, 1.5] - 1) = [-0.375, -0.125]
    want = torch.softmax(torch.tensor([2.0, -0.375, -0.125, 1.0, float("-inf")]), -1)
    torch.testing.assert_close(mean, want)
    assert mean[2] > mean[1]  # the favoured key (π = 0.75) gets the larger share
    torch.testing.assert_close(rebuild_rows(scores, visual, None, "mass"), probs)  # 'own' prior: no-op


@pytest.mark.parametrize(
    ("row", "want"),
    [
        # issue 17's row: π = [0.9, 0.1] over scores [-1, -3] (m = -2); π·|V|·m gave the favoured key 0.039
        ([-1.0, -3.0], [-2 + 2 * 0.8, -2 + 2 * -0.8]),
        ([2.0, -1.0], [0.5 + 0.5 * 0.8, 0.5 + 0.5 * -0.8]),  # mixed signs, m = 0.5
        ([-2.0, 2.0], [0.8, -0.8]),  # mixed signs, m = 0: unit scale
        ([1.0, 3.0], [2 * 1.8, 2 * 0.2]),  # m = 2 > 0: exactly π·|V|·m
    ],
)
def test_mean_logits_keeps_the_priors_order(row, want):
    scores = torch.tensor([[[row]]])
    got = rebuild_rows(scores, torch.tensor([0, 1]), torch.tensor([0.9, 0.1]), "mean_logits")[0, 0, 0]
    torch.testing.assert_close(got, torch.softmax(torch.tensor(want), -1))
    assert got[0] > 0.5  # the favoured key gets the most mass, whatever the sign of the scores


def test_row_scores_match_row_probabilities(tiny_dir, data):
    m = corelens.load(tiny_dir("qwen2_5_vl"))
    p = prepare(m, _sample(data["image"]))
    hook = _Rows()
    with torch.no_grad(), activate(m.layer_modules(), hook):
        m.model(**p.inputs, use_cache=False)
    for softmaxed, probs in hook.pairs:
        torch.testing.assert_close(softmaxed, probs, rtol=0, atol=1e-7)


def test_own_prior_reproduces_stock_model(tiny_dir, any_family, data):
    path = tiny_dir(any_family)
    m = corelens.load(path)
    stock, _ = load_tiny(path)
    p = prepare(m, _sample(data["image"]))
    hook = SapHook()  # prior = the row's own attention; positions from the prompt's context
    gen = {"max_new_tokens": 4, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad(), attention_context(AttentionContext.of(p)), activate(m.layer_modules(), hook):
        ours = m.model(**p.inputs, use_cache=False).logits
        ours_gen = m.model.generate(**p.inputs, **gen)
    with torch.no_grad():
        ref = stock(**p.inputs, use_cache=False).logits
        ref_gen = stock.generate(**p.inputs, **gen)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    assert torch.equal(ours_gen.sequences, ref_gen.sequences)
    for a, b in zip(ours_gen.scores, ref_gen.scores):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_mass_preserving_prior_keeps_visual_mass(tiny_dir, data):
    m = corelens.load(tiny_dir("qwen2_vl"))
    sample = _sample(data["image"])
    p = prepare(m, sample)
    visual = torch.from_numpy(p.layout.visual)
    prior = torch.from_numpy(build_prior(m, sample, p, "noise").astype(np.float32))
    hook = SapHook(prior=prior, heads=parse_heads("band:0-50", m.num_heads), record=True)
    with torch.no_grad():
        stock = m.model(**p.inputs, use_cache=False).logits
        with attention_context(AttentionContext.of(p)), activate(m.layer_modules(), hook):
            ours = m.model(**p.inputs, use_cache=False).logits
    assert len(hook.records) == m.num_layers  # one current row (the last prompt position) per layer
    for _, before, after, chosen in hook.records:
        torch.testing.assert_close(after[:, visual].sum(-1), before[:, visual].sum(-1), rtol=1e-6, atol=1e-7)
        share = after[:, visual] / after[:, visual].sum(-1, keepdim=True)
        torch.testing.assert_close(share, prior.expand_as(share), rtol=1e-5, atol=1e-7)
        text = torch.ones(after.shape[-1], dtype=torch.bool)
        text[visual] = False
        torch.testing.assert_close(after[:, text], before[:, text])
        assert 0 < int(chosen.sum()) < m.num_heads
    torch.testing.assert_close(ours[0, :-1], stock[0, :-1], rtol=0, atol=1e-5)  # only the last row changes
    assert not torch.allclose(ours[0, -1], stock[0, -1], atol=1e-4)


def _one_image(tmp_path, pixels, targets=()):
    """Return a sample of one grey image (rows of pixel values) and the layout of one 1 x 2 or 2 x 2 grid."""
    from PIL import Image

    from corelens.data.sample import Sample
    from corelens.layout import Layout, Segment

    path = tmp_path / "im.png"
    Image.fromarray(np.asarray(pixels, dtype=np.uint8), mode="L").save(path)
    h, w = np.asarray(pixels).shape
    sample = Sample("s", "image", "q", images=(path,), image_sizes=((w, h),), targets=tuple(targets))
    return sample, Layout((Segment("image", 0, 3, h // 2, w // 2, (w, h)),), seq_len=3 + h * w // 4 + 2)


def test_one_hook_reads_each_prompts_positions_and_prior_from_the_context(tiny_dir, data):
    """A SAP hook holds no prompt: built once, it serves two prompts with their own visual positions and
    priors (read from `call.context`), each prior computed once per prompt, and gives what the deprecated
    constructor positions gave."""
    from corelens.attention.prompt_context import attention_context
    from corelens.policies import SharedPrior, context_of

    m = corelens.load(tiny_dir("qwen2_vl"))
    samples = [_sample(data["image"], 0), _sample(data["video"], 0)]
    prompts = [prepare(m, s) for s in samples]
    assert len(prompts[0].layout.visual) != len(prompts[1].layout.visual)  # two different V
    calls = []

    def prior_of(ctx):
        calls.append(ctx.sample.id)
        return build_prior(m, ctx.sample, ctx.prepared, "noise")

    hook = SapHook(prior=prior_of)  # no tensors: one hook for every prompt
    with torch.no_grad(), activate(m.layer_modules(), hook):
        got = []
        for s, p in zip(samples, prompts):
            with attention_context(context_of(p, s)):
                got.append(m.model(**p.inputs, use_cache=False).logits)
    assert calls == [s.id for s in samples]  # once per prompt, not once per layer
    for s, p, logits in zip(samples, prompts, got):
        prior = torch.from_numpy(build_prior(m, s, p, "noise").astype(np.float32))
        with pytest.warns(DeprecationWarning, match="SapHook"):
            old = SapHook(torch.from_numpy(p.layout.visual), prior, p.prompt_len)
        with torch.no_grad(), activate(m.layer_modules(), old):
            want = m.model(**p.inputs, use_cache=False).logits
        assert torch.equal(logits, want)
        policy = SharedPrior("noise", "all")
        with torch.no_grad(), policy.applied(m, p, sample=s):
            assert torch.equal(m.model(**p.inputs, use_cache=False).logits, want)
    no_context = pytest.raises(CorelensError, match="SAP needs the prompt's positions")
    with no_context, torch.no_grad(), activate(m.layer_modules(), SapHook()):
        m.model(**prompts[0].inputs, use_cache=False)  # no context, no positions


def test_key_prior_is_a_tempered_softmax_of_iou():
    from corelens.data.sample import Sample, Target
    from corelens.experiments.sap import prior_key
    from corelens.layout import Layout, Segment

    # A 20 x 20 image in 2 x 2 cells of 10 px; a box over the top-left cell and half of its right neighbour.
    box = Target("box", image=0, box=(0.0, 0.0, 15.0, 10.0))
    sample = Sample("s", "image", "q", image_sizes=((20, 20),), targets=(box,))
    layout = Layout((Segment("image", 0, 3, 2, 2, (20, 20)),), seq_len=9)
    iou = np.array([100 / 150, 50 / 200, 0.0, 0.0])  # cell ∩ box over cell ∪ box, in reading order
    for t in (1.0, 0.1):
        want = np.exp(iou / t) / np.exp(iou / t).sum()
        np.testing.assert_allclose(prior_key(layout, sample, t), want, rtol=1e-12)
    flat = prior_key(layout, sample, 1.0)
    assert flat.max() / flat.min() < np.e  # inputs in [0, 1]: at T = 1 the prior is close to uniform


def test_complexity_prior_is_a_tempered_softmax_of_cell_complexity(tmp_path):
    from types import SimpleNamespace

    from corelens.experiments.sap import prior_complexity

    # Three 2 x 2-pixel cells (grey levels 0 / 1): flat (complexity 0); a checkerboard, mean |dx| = 1,
    # mean |dy| = 1, variance 1/4: 2.25; a dark row over a light one, 0 + 1 + 1/4 = 1.25. Min-max: 0, 1, 5/9.
    pixels = [[9, 9, 0, 255, 0, 0], [9, 9, 255, 0, 255, 255]]
    sample, layout = _one_image(tmp_path, pixels)
    m = SimpleNamespace(
        processor=SimpleNamespace(image_processor=SimpleNamespace(patch_size=1, merge_size=2))
    )
    for t in (1.0, 0.1):
        want = np.exp(np.array([0.0, 1.0, 5 / 9]) / t) / np.exp(np.array([0.0, 1.0, 5 / 9]) / t).sum()
        np.testing.assert_allclose(prior_complexity(m, layout, sample, t), want, rtol=1e-12)
    with pytest.raises(CorelensError, match="positive"):
        build_prior(m, sample, None, "complexity", temperature=0.0)


def test_complexity_prior_follows_the_image_in_every_family(tiny_dir, any_family, tmp_path):
    """Left half flat grey, right half noise: every cell wholly on the right outweighs every cell on the left,
    in every family's layout (tiles, crops, thumbnails and bilinear footprints included)."""
    from PIL import Image

    from corelens.data.sample import Sample
    from corelens.experiments.sap import prior_complexity
    from tests.helpers import noise_image

    width, height = 320, 240
    image = Image.new("RGB", (width, height), (120, 120, 120))
    image.paste(noise_image(width // 2, height, seed=3), (width // 2, 0))
    image.save(tmp_path / "half.png")
    sample = Sample(
        id="half", task="image", question="colour?", answer="red", images=[str(tmp_path / "half.png")]
    )
    m = corelens.load(tiny_dir(any_family))
    layout = prepare(m, sample).layout
    prior = prior_complexity(m, layout, sample)
    where = {int(pos): i for i, pos in enumerate(layout.visual)}
    left, right = [], []
    for seg in layout.segments:
        xs, ys = seg.cell_spans()
        for r, (y0, y1) in enumerate(ys):
            for c, (x0, x1) in enumerate(xs):
                if y0 < 0 or y1 > height:
                    continue  # padding rows
                value = prior[where[int(seg.token(r, c))]]
                if x0 >= 0 and x1 <= width // 2 - 1:
                    left.append(value)
                elif x0 >= width // 2 + 1 and x1 <= width:
                    right.append(value)
    assert left and right
    assert min(right) > max(left)


def test_noise_prior_is_the_seeded_dirichlet_draw(tiny_dir, data):
    from corelens.experiments.flow import sample_seed

    m = corelens.load(tiny_dir("qwen2_5_vl"))
    sample = _sample(data["image"])
    p = prepare(m, sample)
    n = len(p.layout.visual)
    want = np.random.default_rng(sample_seed(1, sample.id)).dirichlet(np.ones(n))
    np.testing.assert_array_equal(build_prior(m, sample, p, "noise", seed=1), want)
    assert not np.array_equal(build_prior(m, sample, p, "noise", seed=2), want)
    assert build_prior(m, sample, p, "own") is None


def test_vis_attn_undoes_the_window_order(tiny_dir, data):
    """Qwen2.5-VL's blocks run in window order: the pooled prior must follow the merger's (decoder) order."""
    m = corelens.load(tiny_dir("qwen2_5_vl"))
    p = prepare(m, _sample(data["image"]))
    visual = m.model.model.visual
    seen = []
    handle = visual.blocks[-1].register_forward_hook(lambda mod, a, out: seen.append(out))
    try:
        with torch.no_grad():
            pooled = visual(p.inputs["pixel_values"], grid_thw=p.inputs["image_grid_thw"]).pooler_output
    finally:
        handle.remove()
    from transformers.vision_utils import get_vision_window_index

    index, _ = get_vision_window_index(
        p.inputs["image_grid_thw"], spatial_merge_size=2, window_size=visual.window_size, patch_size=14
    )
    assert not torch.equal(index, torch.arange(len(index)))  # the image spans several windows
    torch.testing.assert_close(visual.merger(seen[0])[torch.argsort(index)], pooled)
    prior = prior_vis_attn(m, p)
    assert prior.shape == (len(p.layout.visual),) and prior.std() > 0


def test_vis_attn_is_the_last_blocks_attention_received(tiny_dir, data):
    """Qwen2-VL (no window order): the prior is the attention each vision token receives in the tower's last
    block, averaged over all queries and heads, summed over each 2 x 2 merge group, normalised; computed here
    densely from the block's own inputs, with the tower's rotary function."""
    import sys

    m = corelens.load(tiny_dir("qwen2_vl"))
    p = prepare(m, _sample(data["image"]))
    visual = m.model.model.visual
    attn = visual.blocks[-1].attn
    seen = []
    handle = attn.register_forward_pre_hook(lambda mod, a, kw: seen.append((a, kw)), with_kwargs=True)
    try:
        with torch.no_grad():
            visual(p.inputs["pixel_values"], grid_thw=p.inputs["image_grid_thw"])
    finally:
        handle.remove()
    args, kwargs = seen[0]
    hidden = (args[0] if args else kwargs["hidden_states"]).double()
    n = hidden.shape[0]
    assert kwargs["cu_seqlens"].tolist() == [0, n]  # one image: one attention chunk
    heads = attn.num_heads
    q, k, _ = (
        (hidden @ attn.qkv.weight.double().T + attn.qkv.bias.double()).reshape(n, 3, heads, -1).unbind(1)
    )
    cos, sin = (t.double() for t in kwargs["position_embeddings"])
    q, k = sys.modules[type(attn).__module__].apply_rotary_pos_emb_vision(q, k, cos, sin)
    weights = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * attn.scaling, dim=-1)  # heads, queries, keys
    received = weights.mean(dim=(0, 1))  # per key token, over every query and head
    want = received.view(-1, 4).sum(1)  # 2 x 2 patches per decoder token, in the tower's order
    want = (want / want.sum()).detach().numpy()
    np.testing.assert_allclose(prior_vis_attn(m, p), want, rtol=1e-5, atol=1e-9)
    assert want.max() / want.min() > 1.01  # a prior that is not uniform


def test_key_region_ratio_equals_eager_attention(tiny_dir, data):
    path = tiny_dir("qwen2_vl")
    m = corelens.load(path)
    eager, _ = load_tiny(path, attn_implementation="eager")
    sample = _sample(data["image"])
    p = prepare(m, sample)
    ratio, area = key_region(m, sample, p)
    omega, visual = p.layout.omega(sample.targets), p.layout.visual
    with torch.no_grad():
        att = eager(**p.inputs, output_attentions=True, use_cache=False).attentions
    rows = [a[0, :, -1].double() for a in att]  # (heads, keys) at the answer position
    want = np.mean([(r[:, omega].sum(-1) / r[:, visual].sum(-1)).numpy() for r in rows])
    assert ratio == pytest.approx(want, rel=1e-5)
    assert area == pytest.approx(len(omega) / len(visual))


def test_sap_run_and_cli(tiny_dir, data, tmp_path):
    path = tiny_dir("qwen2_5_vl")
    m = corelens.load(path)
    out = tmp_path / "run"
    result = sap(m, data["image"], priors=("noise", "own"), layers=("all", "1"), out=out, max_new_tokens=3)
    acc = pd.read_csv(out / "accuracy.csv")
    assert acc["condition"].tolist() == ["vanilla", "noise@all", "noise@1", "own@all", "own@1"]
    own = acc[acc["condition"].str.startswith("own")]
    assert (own["changed_answers"] == 0).all() and (own["accuracy"] == acc["accuracy"][0]).all()
    frame = pd.read_parquet(out / "sap.parquet")
    assert len(frame) == 2 * 5 and set(frame["sample_id"]) == {"image-00000", "image-00001"}
    regions = pd.read_csv(out / "key_region.csv")
    assert regions["group"].tolist() == ["correct", "incorrect", "all"] and regions["n"].iloc[-1] == 2
    assert (out / "figures" / "sap_accuracy.png").stat().st_size > 1000
    assert result.accuracy["n"].tolist() == [2] * 5
    # priors.csv: each prior's mass on Ω beside the area share and the model's own share (key_region.csv).
    table = pd.read_csv(out / "priors.csv")
    assert table["prior"].tolist() == ["noise"] and table["n"].tolist() == [2]
    allrow = regions.iloc[-1]
    assert table["area_share"].iloc[0] == pytest.approx(allrow["area_prior"])
    assert table["model_share"].iloc[0] == pytest.approx(allrow["key_ratio"])
    sharp = sap(m, data["image"], priors=("key",), layers=("1",), prior_temperature=0.05, max_new_tokens=2)
    assert sharp.priors["omega_mass"].iloc[0] > 0.9 and sharp.priors["temperature"].iloc[0] == 0.05
    flat = sap(m, data["image"], priors=("key",), layers=("1",), max_new_tokens=2).priors.iloc[0]
    assert flat["lift"] < sharp.priors["lift"].iloc[0] and flat["spread"] <= np.e + 1e-9
    args = ["sap", "--model", str(path), "--data", str(data["image"]), "--max-new-tokens", "2"]
    assert (
        main([*args, "--out", str(tmp_path / "cli"), "--prior", "key", "--layers", "0", "--limit", "1"]) == 0
    )
    assert main([*args, "--out", str(tmp_path / "bad"), "--prior", "key", "--layers", "9-12"]) == 2
