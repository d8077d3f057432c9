"""Annotation-free Omega (`corelens rank --omega causal`, issue 21): occlusion and gradient x input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import corelens as cl
from corelens.capture.omega import (
    OmegaSettings,
    answer_logprob,
    estimate_omega,
    first_layer_input,
    input_gradient,
    occlusion_scores,
    own_answer,
)
from corelens.data.sample import read_samples
from corelens.errors import InputError
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate


@pytest.fixture(scope="module")
def organism():
    return cl.load(organism_path(), device="cpu")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    path = generate("image", tmp_path_factory.mktemp("omega"), 4, seed=5)
    return path, read_samples(path)[0]


def test_occlusion_finds_the_answer_cell(organism, images):
    # Each organism object sits in its own token cell and only the named object's shape is asked: the
    # answer depends on the target cell alone, and occlusion must return exactly that cell.
    for sample in images[1]:
        truth = prepare(organism, sample).layout.omega(sample.targets, "centre")
        omega, said = estimate_omega(organism, sample, OmegaSettings("occlusion"))
        assert said == sample.answer
        assert omega.tolist() == truth.tolist(), sample.id


def test_occlusion_batches_change_nothing(organism, images):
    sample = images[1][0]
    prepared = prepare(organism, sample)
    answer = own_answer(organism, prepared)
    one = occlusion_scores(organism, sample, OmegaSettings(batch=1), prepared, answer)
    many = occlusion_scores(organism, sample, OmegaSettings(batch=16), prepared, answer)
    assert one[0].tolist() == many[0].tolist()
    np.testing.assert_allclose(one[1], many[1], atol=1e-5)


def test_gradient_matches_finite_differences(organism, images):
    m = cl.load(organism_path(), device="cpu")
    m.model.to(torch.float64)
    sample = images[1][1]
    prepared = prepare(m, sample)
    answer = own_answer(m, prepared)
    embeds, grad = input_gradient(m, prepared, answer)
    # Replacing the first layer's input by itself is the identity.
    plain = answer_logprob(m, [prepared.inputs], answer)
    assert answer_logprob(m, [prepared.inputs], answer, embeds=embeds).item() == pytest.approx(
        plain.item(), abs=1e-12
    )
    # Qwen's RMSNorm computes in float32 even in a float64 model: the central difference at eps = 1e-3 is
    # exact to about 1e-5 of the derivative here (1e-4 is float32 noise, 1e-2 curvature); rel 1e-3 is the bound.
    rng = np.random.default_rng(0)
    for tokens in (prepared.layout.visual[:3], prepared.layout.omega(sample.targets)):
        direction = torch.zeros_like(embeds)
        values = rng.standard_normal((len(tokens), embeds.shape[1]))
        direction[torch.from_numpy(tokens)] = torch.from_numpy(values)
        eps = 1e-3
        up = answer_logprob(m, [prepared.inputs], answer, embeds=embeds + eps * direction).item()
        down = answer_logprob(m, [prepared.inputs], answer, embeds=embeds - eps * direction).item()
        assert (grad * direction).sum().item() == pytest.approx((up - down) / (2 * eps), rel=1e-3)
    assert first_layer_input(m, prepared).shape == embeds.shape


def test_rank_causal_runs_without_targets(organism, images, tmp_path, capsys):
    path, _ = images
    stripped = tmp_path / "plain.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    stripped.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "targets"}) + "\n" for r in rows)
    )
    stripped.with_name("img").symlink_to(path.parent / "img")
    settings = OmegaSettings("gradient")
    ranking = cl.rank(
        organism, stripped, out=tmp_path / "run", omega=settings, n_boot=20, ks=None, progress=True
    )
    said = "rank: --omega causal (gradient) on 4 samples: per sample its greedy answer (up to 8 tokens), then one"
    assert said in capsys.readouterr().err  # what each sample costs, before the first starts
    assert ranking.ram["sample_id"].nunique() == 4
    assert (ranking.ram["n_omega"] > 0).all()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["settings"]["omega"] == {"source": "causal", **settings.to_json()}


def test_bad_settings_are_one_line_errors():
    with pytest.raises(InputError, match="unknown Omega estimator"):
        OmegaSettings("saliency")
    with pytest.raises(InputError, match="ratio"):
        OmegaSettings(ratio=0.0)
