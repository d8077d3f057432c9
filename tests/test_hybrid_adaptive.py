"""Input-adaptive hybrid attention (issue 21): the `adaptive-hybrid` policy (`AdaptiveHybrid(budget=F)`)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import corelens as cl
from corelens.attention import activate
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.attention.streaming import HybridPlan
from corelens.data.sample import read_samples
from corelens.errors import CorelensError
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.policies import AdaptiveHybrid, HybridAttention

SINK, WINDOW = 4, 16  # the organism's hybrid setting (benchmarks/organism/hybrid.sh): prompts stream


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    m = cl.load(organism_path(), device="cpu")
    samples, _ = read_samples(generate("document", tmp_path_factory.mktemp("adaptive"), 2, seed=4))
    inputs = [prepare(m, s) for s in samples]
    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(m.num_layers), m.num_heads),
            "head": np.tile(np.arange(m.num_heads), m.num_layers),
        }
    )
    table["mass"] = rng.random(len(table))
    table["rank"] = table["mass"].rank(ascending=False, method="first").astype(int)
    return m, inputs, table


def _logits(m, prepared):
    with torch.no_grad():
        return m.model(**prepared.inputs, use_cache=False).logits


def _adaptive(m, prepared, budget, prior=None, **options):
    """Apply `AdaptiveHybrid` with the per-layer counts of `prior`'s top `budget` (a head table or a plain
    policy) for the prompt `prepared`; the block's value is the applied policy."""
    fixed = None
    if prior is not None:
        fixed = (prior if isinstance(prior, HybridPlan) else HybridPlan.from_heads(prior, budget)).full
    return AdaptiveHybrid(budget, fixed, **{"sink": SINK, "window": WINDOW, **options}).applied(m, prepared)


def test_budget_one_is_dense(setup):
    m, inputs, table = setup
    for x in inputs:
        with _adaptive(m, x, 1.0) as on:
            got = _logits(m, x)
        h = on.hooks[0].session
        assert torch.equal(got, _logits(m, x))
        assert bool(h.hook.chosen[-1].all()) and h.stats["signal"] == 0


def test_fixed_signal_is_the_fixed_policy(setup):
    m, inputs, table = setup
    for budget in (0.125, 0.25, 0.5):
        policy = HybridPlan.from_heads(table, budget, sink=SINK, window=WINDOW)
        for x in inputs:
            with HybridAttention.of(policy).applied(m, x) as on:
                want = _logits(m, x)
            fixed = on.hooks[0].session
            with _adaptive(m, x, budget, table, signal=table) as on:
                got = _logits(m, x)
            h = on.hooks[0].session
            assert torch.equal(h.hook.chosen[-1], policy.full_mask(m.num_layers, m.num_heads))
            assert torch.equal(got, want)
            assert (
                fixed.stats["prefill:blocked"] > 0
            )  # the policy does stream: the check is not dense vs dense


def test_measured_signal_keeps_the_quota_and_streams(setup):
    m, inputs, table = setup
    policy = HybridPlan.from_heads(table, 0.25)
    session = AdaptiveHybrid(0.25, policy.full, SINK, WINDOW).session(m)
    for x in inputs:  # one session across two prompts: each prefill chooses its own heads
        with attention_context(AttentionContext.of(x)), activate(m.layer_modules(), session.hook):
            _logits(m, x)
    h = session
    assert len(h.hook.chosen) == 2 and h.stats["signal"] == 2 * m.num_layers
    for chosen in h.hook.chosen:
        assert chosen.sum(dim=1).tolist() == policy.full_mask(m.num_layers, m.num_heads).sum(dim=1).tolist()


def test_adaptive_errors():
    m = cl.load(organism_path(), device="cpu")
    for budget in (0.0, 1.5):
        with pytest.raises(CorelensError, match="in \\(0, 1\\]"), AdaptiveHybrid(budget).applied(m):
            pass
    with pytest.raises(CorelensError, match="rows >= 1"), AdaptiveHybrid(0.5, rows=0).applied(m):
        pass


def test_signal_is_the_ram_probes_visual_mass(setup):
    # With a window wider than the prompt every layer's prefill is dense, so each layer's signal must be the
    # RAM probe's visual mass of the same rows in a plain forward; the chosen heads are its top quota_l.
    from corelens.attention import RamProbe

    m, inputs, table = setup
    x = inputs[0]
    n = x.inputs["input_ids"].shape[1]
    rows = torch.arange(n - 16, n)
    visual = torch.nonzero(
        torch.isin(x.inputs["input_ids"][0], torch.tensor([m.model.config.image_token_id]))
    )[:, 0]
    probe = RamProbe(m.num_layers, m.num_heads, rows, visual, visual, n)
    with activate(m.layer_modules(), probe):
        _logits(m, x)
    with _adaptive(m, x, 0.25, table, window=10**6) as on:
        _logits(m, x)
    h = on.hooks[0].session
    quota = HybridPlan.from_heads(table, 0.25).full_mask(m.num_layers, m.num_heads).sum(dim=1)
    for layer, signal in h.hook.signals[0].items():
        torch.testing.assert_close(signal, probe.visual_mass[layer], rtol=0, atol=1e-6)
        top = set(np.argsort(-signal.double().numpy(), kind="stable")[: int(quota[layer])].tolist())
        assert set(torch.nonzero(h.hook.chosen[0][layer])[:, 0].tolist()) == top
    assert 0 < len(h.hook.signals[0]) == int(((quota > 0) & (quota < m.num_heads)).sum())


def test_hybrid_command_runs_the_adaptive_set(setup, tmp_path, capsys):
    from corelens.cli import main

    m, _, table = setup
    heads = tmp_path / "heads.csv"
    table.to_csv(heads, index=False)
    data = generate("document", tmp_path / "data", 3, seed=4)
    out = tmp_path / "run"
    argv = ["hybrid", "--model", str(organism_path()), "--data", str(data), "--heads", str(heads),
            "--out", str(out), "--keep", "25%,100%", "--sets", "top,adaptive", "--sink", str(SINK),
            "--window", str(WINDOW), "--max-new-tokens", "2"]  # fmt: skip
    assert main(argv) == 0
    result = pd.read_csv(out / "hybrid.csv")
    assert list(result["set"]) == ["dense", "top", "adaptive", "top", "adaptive"]
    assert list(result["full_heads"]) == [32, 8, 8, 32, 32]
    records = pd.read_parquet(out / "records.parquet").set_index(["condition", "sample"])["prediction"]
    # At budget 1.0 every head is full: the adaptive answers are the dense model's.
    assert records["adaptive/100%"].tolist() == records["dense"].tolist()
    # At 25 % the heads are chosen per prompt: each answer is the Python API's with the top set's quotas.
    policy = HybridPlan.from_heads(table, "25%", sink=SINK, window=WINDOW)
    samples, _ = read_samples(data)
    for sample in samples:
        prepared = prepare(m, sample)
        inputs = prepared.inputs
        with torch.no_grad(), _adaptive(m, prepared, 0.25, policy) as on:
            new = m.model.generate(**inputs, max_new_tokens=2, do_sample=False)[
                0, inputs["input_ids"].shape[1] :
            ]
        h = on.hooks[0].session
        want = m.processor.tokenizer.decode(new, skip_special_tokens=True).strip()
        assert (
            h.hook.chosen[0].sum(dim=1).tolist()
            == policy.full_mask(m.num_layers, m.num_heads).sum(dim=1).tolist()
        )
        assert records["adaptive/25%", sample.id] == want
    policies = json.loads((out / "policies.json").read_text())
    assert [p["adaptive"] for p in policies] == [False, False, True, False, True]
    capsys.readouterr()
    assert (
        main([*argv[:-2], "--max-new-tokens", "2", "--decode", "stream", "--out", str(tmp_path / "s")]) == 2
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        err.splitlines()[-1]
        == "corelens: error: the adaptive set decodes with full attention: use --decode full"
    )
