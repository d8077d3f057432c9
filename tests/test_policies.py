"""Policies (`corelens.policies`): registered plain data, applied with the prompt's context, the one `answer`;
the names they replace warn for one release and still work."""

from __future__ import annotations

import pytest
import torch

import corelens as cl
from corelens.data import read_samples
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.policies import (
    AdaptiveHybrid,
    HybridAttention,
    KnockoutHeads,
    MeanHeads,
    Policy,
    SharedPrior,
    UniformHeads,
    ZeroHeads,
)

CORE = [(0, 5), (0, 6), (0, 7)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    m = cl.load(organism_path(), device="cpu")
    samples, _ = read_samples(generate("image", tmp_path_factory.mktemp("policies"), 1, seed=1))
    return m, samples[0], prepare(m, samples[0])


EXAMPLES = [
    ZeroHeads(CORE, label="top/3"),
    MeanHeads(CORE, means="means.npz"),
    UniformHeads(CORE, seed=2),
    KnockoutHeads(CORE, keys="omega"),
    HybridAttention(CORE, 4, 8, decode="stream"),
    AdaptiveHybrid(0.25, tuple(CORE), 4, 8),
    SharedPrior("noise", "0-3", convention="logits"),
]


@pytest.mark.parametrize("policy", EXAMPLES, ids=lambda p: p.name)
def test_every_policy_is_registered_plain_data(policy):
    data = policy.to_dict()
    assert data["name"] == policy.name and cl.POLICIES[policy.name] is type(policy)
    assert Policy.from_dict(data) == policy  # dispatched by name
    assert Policy.from_json(policy.to_json()) == policy
    with pytest.raises(cl.OptionError, match="unknown field"):
        Policy.from_dict({**data, "colour": 1})


def test_answer_under_a_policy_changes_what_it_should(setup):
    m, sample, p = setup
    plain = cl.answer(m, p, None, max_new_tokens=2)
    assert plain == "green cross"  # the doctest of `activate`'s neighbours: the organism's answer
    assert cl.answer(m, p, ZeroHeads(CORE), max_new_tokens=2) == "green ring"
    assert cl.answer(m, p, KnockoutHeads(CORE), max_new_tokens=2) == "green square"
    assert cl.answer(m, p, ZeroHeads([(1, 1), (2, 2), (3, 3)]), max_new_tokens=2) == plain


def test_knockout_decoding_reads_the_prefills_positions(setup):
    """Cached decoding steps (positions beyond the prompt) mask what a full re-run masks."""
    m, sample, p = setup
    policy = KnockoutHeads([(layer, h) for layer in range(2) for h in range(8)], keys="omega")
    with torch.no_grad(), policy.applied(m, p, sample=sample):
        cached = m.model.generate(**p.inputs, max_new_tokens=3, do_sample=False)
        step = dict(p.inputs)
        for _ in range(3):  # greedy by re-running the whole sequence (no cache)
            nxt = m.model(**step, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            for name, value in (("input_ids", nxt), ("attention_mask", 1), ("mm_token_type_ids", 0)):
                if name in step:
                    tail = value if torch.is_tensor(value) else torch.full_like(nxt, value)
                    step[name] = torch.cat([step[name], tail.to(step[name].dtype)], 1)
    assert torch.equal(cached, step["input_ids"])


def test_a_forward_without_context_is_refused(setup):
    m, sample, p = setup
    with (
        pytest.raises(cl.CorelensError, match="needs the prompt's positions"),
        torch.no_grad(),
        KnockoutHeads(CORE).applied(m),
    ):
        m.model(**p.inputs)
    omega = KnockoutHeads(CORE, keys="omega")  # applied without the sample: no targets to take Omega from
    with (
        pytest.raises(cl.CorelensError, match="needs the sample's Omega"),
        torch.no_grad(),
        omega.applied(m, p),
    ):
        m.model(**p.inputs)


def test_deprecated_names_warn_and_still_work(setup):
    m, sample, p = setup
    want = cl.answer(m, p, ZeroHeads(CORE), max_new_tokens=2)
    with pytest.warns(DeprecationWarning, match="corelens.Ablation"):
        ablation = cl.Ablation(CORE, "knockout")
    assert ablation.policy() == KnockoutHeads(CORE)
    with pytest.warns(DeprecationWarning, match="corelens.ablate"), cl.ablate(m, CORE, op="zero"):
        got = cl.answer(m, p, None, max_new_tokens=2)
    assert got == want
    with pytest.warns(DeprecationWarning, match="corelens.ablate"), cl.ablate(m, CORE, op="knockout"):
        got = cl.answer(m, p, None, max_new_tokens=2)  # visual positions from the token ids, as before
    assert got == cl.answer(m, p, KnockoutHeads(CORE), max_new_tokens=2)
    hybrid = HybridAttention(CORE, 4, 8)
    with pytest.warns(DeprecationWarning, match="corelens.hybrid"), cl.hybrid(m, CORE, sink=4, window=8) as h:
        got = cl.answer(m, p, None, max_new_tokens=2)
    assert got == cl.answer(m, p, hybrid, max_new_tokens=2) and h.stats["prefill:blocked"] > 0
    with (
        pytest.warns(DeprecationWarning, match="corelens.hybrid"),
        cl.hybrid(m, full="adaptive", budget=0.25, prior=hybrid.plan(), sink=4, window=8) as h,
    ):
        got = cl.answer(m, p, None, max_new_tokens=2)
    assert got == cl.answer(m, p, AdaptiveHybrid(0.25, tuple(CORE), 4, 8), max_new_tokens=2)
    assert h.stats["signal"] > 0


def test_policy_and_prior_bases_are_abstract():
    """`Policy`, its intermediates (`HeadsPolicy`, `SessionPolicy`) and `Prior` cannot be built; a registered
    class must define what they leave open, or registering it is refused."""
    from dataclasses import dataclass

    from corelens.policies import HeadsPolicy, PolicyInterface, Prior
    from corelens.policies.hybrid_attention import SessionPolicy

    for base, missing in (
        (Policy, "hooks"),
        (HeadsPolicy, "hooks"),
        (SessionPolicy, "session"),
        (Prior, "values"),
    ):
        with pytest.raises(TypeError, match=missing):
            base()

    @dataclass(frozen=True)
    class Unfinished(HeadsPolicy):
        name = "unfinished"

    with pytest.raises(cl.OptionError, match="'unfinished' .* is abstract: it does not define hooks"):
        PolicyInterface.register(Unfinished)
    assert "unfinished" not in cl.POLICIES
