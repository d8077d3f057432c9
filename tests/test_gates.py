"""`gates` (DuoAttention's gate optimisation, docs/methods.md#gates) on the organism: the gated loss against a
hand-made two-forward reference, its gradient by finite differences, the quantile binarisation, and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import hybrid

import corelens
from corelens.experiments.gates import GateSettings, binarize, fit_gates, gate_distance, top
from corelens.experiments.importance import answer_logp
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate

MODEL = str(organism_path())
S, W = 2, 4  # the organism's image prompts (about 55 tokens with the answer) stream under this budget


@pytest.fixture(scope="module")
def organism():
    return corelens.load(MODEL, device="cpu")


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    path = generate("image", tmp_path_factory.mktemp("gates"), 4, seed=3)
    return corelens.read_samples(path)[0]


def _o_proj_input(m, forced, layer, hybrid_full=None):
    """Return the o_proj input of `layer` (batch, seq, heads * dim) in a dense forward, or under
    `corelens.hybrid` with the full set `hybrid_full` (the hybrid kernels, not the gate hook)."""
    seen = {}

    def keep(module, args):
        seen["x"] = args[0].detach().clone()

    handle = m.attention_layers[layer].o_proj.register_forward_pre_hook(keep)
    try:
        with torch.no_grad():
            if hybrid_full is None:
                m.model(**forced.to(m.device), use_cache=False)
            else:
                with hybrid(m, hybrid_full, sink=S, window=W, kernel="reference"):
                    m.model(**forced.to(m.device), use_cache=False)
    finally:
        handle.remove()
    return seen["x"]


def _reference(m, forced, layer, alpha_layer):
    """The gated model with only `layer` gated, by hand: a dense forward and a streaming forward give the
    layer's two head outputs, mixed per head and put into a third, dense forward through o_proj's input.
    Returns (answer-row final hidden states, log p(answer))."""
    d = m.text_config.head_dim
    every = [(i, h) for i in range(m.num_layers) for h in range(m.num_heads) if i != layer]
    full = _o_proj_input(m, forced, layer)
    stream = _o_proj_input(m, forced, layer, hybrid_full=every)  # `layer` streams, the rest are dense
    a = alpha_layer.double().repeat_interleave(d)
    mixed = (a * full.double() + (1 - a) * stream.double()).to(full.dtype)

    def put(module, args):
        return (mixed,)

    handle = m.attention_layers[layer].o_proj.register_forward_pre_hook(put)
    try:
        with torch.no_grad():
            out = m.model(**forced.to(m.device), use_cache=False, output_hidden_states=True)
            logp = answer_logp(m, forced)
    finally:
        handle.remove()
    rows = torch.as_tensor(forced.answer_rows)
    return out.hidden_states[-1][0, rows].float(), float(logp)


def test_gate_loss_equals_the_two_forward_reference(organism, samples):
    m = organism
    forced = prepare(m, samples[0], answer=samples[0].answer)
    with torch.no_grad():
        dense_hidden = m.model(**forced.to(m.device), use_cache=False, output_hidden_states=True)
        target_h = dense_hidden.hidden_states[-1][0, torch.as_tensor(forced.answer_rows)].float()
        target_p = answer_logp(m, forced)
    for layer in (1, 3):
        alpha_layer = torch.linspace(0.05, 0.95, m.num_heads)[
            torch.randperm(m.num_heads, generator=torch.Generator().manual_seed(layer))
        ]
        alpha = torch.ones(m.num_layers, m.num_heads)
        alpha[layer] = alpha_layer
        hidden, logp = _reference(m, forced, layer, alpha_layer)
        want_h = float((hidden - target_h).pow(2).mean(dim=-1).mean())
        with torch.no_grad():
            got_h = float(
                gate_distance(m, forced, target_h, alpha, GateSettings(sink=S, window=W, loss="hidden"))
            )
            got_p = float(
                gate_distance(m, forced, target_p, alpha, GateSettings(sink=S, window=W, loss="logp"))
            )
        assert want_h > 1e-6  # the streaming pass changes something: the comparison is not vacuous
        assert got_h == pytest.approx(want_h, rel=1e-4, abs=1e-9)
        assert got_p == pytest.approx(float(target_p) - logp, rel=1e-4, abs=1e-7)


def test_all_gates_at_zero_are_hybrid_attention_with_no_full_head(organism, samples):
    m = organism
    forced = prepare(m, samples[1], answer=samples[1].answer)
    with torch.no_grad():
        base = float(answer_logp(m, forced))
        with hybrid(m, (), sink=S, window=W, kernel="reference"):
            streamed = float(answer_logp(m, forced))
        got = float(gate_distance(m, forced, torch.tensor(base, dtype=torch.float64),
                                  torch.zeros(m.num_layers, m.num_heads), GateSettings(sink=S, window=W, loss="logp")))  # fmt: skip
    assert abs(base - streamed) > 1e-3
    assert got == pytest.approx(base - streamed, abs=1e-5)


@pytest.mark.e2e
@pytest.mark.parametrize("loss", ["hidden", "logp"])
def test_gradient_matches_finite_differences(samples, loss):
    m = corelens.load(MODEL, device="cpu", dtype=torch.float64)
    forced = prepare(m, samples[2], answer=samples[2].answer)
    settings = GateSettings(sink=S, window=W, loss=loss, lam=0.05)
    from corelens.experiments.gates import _targets

    target = _targets(m, forced, loss)
    for p in m.model.parameters():
        p.requires_grad_(False)
    start = torch.rand(
        m.num_layers, m.num_heads, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    alpha = (0.2 + 0.6 * start).requires_grad_(True)

    def f(a):
        return gate_distance(m, forced, target, a, settings) + settings.lam * a.mean()

    # Central differences with a step of 1e-3: the model's float64 forward keeps a few float32 steps (a
    # smaller step drowns in their rounding); the truncation error is O(step^2).
    assert torch.autograd.gradcheck(f, (alpha,), eps=1e-3, atol=2e-3, rtol=2e-3)


def test_binarize_keeps_the_heads_at_or_above_the_quantile():
    alpha = np.random.default_rng(1).permutation(np.arange(32) / 31).reshape(4, 8)
    full = binarize(alpha, 0.75)
    assert full.sum() == 8 and (alpha[full] > alpha[~full].max()).all()  # the 8 largest of 32
    assert binarize(alpha, 1.0).sum() == 0 and binarize(alpha, 0.0).sum() == 32
    assert (binarize(alpha, 0.5) == (alpha >= np.quantile(alpha, 0.5))).all()
    ties = np.full((2, 4), 0.5)
    assert binarize(ties, 0.5).sum() == 4  # the noise breaks ties: half of equal gates
    assert top(np.array([[0.1, 0.9], [0.9, 0.3]]), 2) == [(0, 1), (1, 0)]


@pytest.mark.e2e
def test_resume_gives_the_uninterrupted_gates(organism, samples, tmp_path):
    settings = GateSettings(sink=S, window=W, epochs=2, batch=2, lr=0.05, lam=0.5)
    whole = fit_gates(organism, samples, settings, folder=tmp_path / "whole")
    (tmp_path / "cut").mkdir()
    first = fit_gates(organism, samples, settings, folder=tmp_path / "cut", stop_after=1)
    assert first.steps == 1
    fit_gates(organism, samples, settings, folder=tmp_path / "cut", stop_after=3)
    resumed = fit_gates(organism, samples, settings, folder=tmp_path / "cut")
    assert resumed.steps == whole.steps == 4
    assert np.array_equal(resumed.alpha, whole.alpha)
    assert resumed.losses.equals(whole.losses)
    assert (whole.alpha < 1).any() and (whole.alpha >= 0).all()  # the gates moved, and stayed clamped


def test_rank_score_gates_writes_the_gates_as_the_head_score(organism, samples, tmp_path):
    """`rank(score="gates")`: heads.csv's score is each head's learned alpha, the manifest names the scorer,
    and the loss curve is in the run (table and figure)."""
    import json

    import pandas as pd

    data = generate("image", tmp_path / "data", 3, seed=3)
    score = {"name": "gates", "sink": str(S), "window": str(W), "gate_epochs": 1, "gate_batch": 3}
    corelens.rank(organism, data, score=score, k=None, out=tmp_path / "run")
    heads = pd.read_csv(tmp_path / "run" / "heads.csv").set_index(["layer", "head"])["mass"]
    gates = pd.read_csv(tmp_path / "run" / "gates.csv").set_index(["layer", "head"])["alpha"]
    assert np.allclose(heads.sort_index().to_numpy(), gates.sort_index().to_numpy())
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["settings"]["score"]["name"] == "gates"
    assert len(pd.read_csv(tmp_path / "run" / "gate_losses.csv")) == 1
    assert (tmp_path / "run" / "figures" / "gate_loss.png").is_file()
