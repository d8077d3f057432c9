"""What every registered policy (`corelens.policies.POLICIES`) must do, checked for each name, a new one included.

Its JSON is itself (`Policy.from_json(p.to_json()) == p`), equal policies are equal and hash alike, its empty
head set changes no logit and no answer, and `applied` leaves no hook behind (even when the block raises). A
name gets `EXAMPLES` (an instance that changes the organism's answer) and `NEUTRAL` (its empty head set) here
only when the defaults do not fit: by default a `HeadsPolicy` is tried on `CORE` and every policy's `NAME()` is
its neutral form. A policy's own test then only checks its effect against an independent reference
(docs/extending/policy.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import corelens as cl
from corelens.attention import dispatch
from corelens.attention.interventions import HeadMeans
from corelens.data import read_samples
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.policies import POLICIES, HeadsPolicy, Policy

CORE = ((0, 5), (0, 6), (0, 7))  # the organism's top 3 heads: zeroing them changes its answer
SHAPE = SimpleNamespace(layers=4, heads=8, means="means.npz")  # the organism; `means`: a statistics file


def _every_head(shape) -> tuple[tuple[int, int], ...]:
    return tuple((layer, head) for layer in range(shape.layers) for head in range(shape.heads))


# name -> an instance that changes the organism's answer, where `NAME(heads=CORE)` (a HeadsPolicy) or `NAME()`
# does not fit; each is a function of SHAPE (the model's layers and heads, a means file).
EXAMPLES: dict[str, Callable[[SimpleNamespace], Policy]] = {
    "mean": lambda s: POLICIES["mean"](CORE, means=s.means),
    "knockout": lambda s: POLICIES["knockout"](CORE, keys="visual", label="top/3"),
    "hybrid": lambda s: POLICIES["hybrid"]((), 1, 4, decode="stream"),  # every head streams: 1 sink, 4 keys
    "adaptive-hybrid": lambda s: POLICIES["adaptive-hybrid"](0.25, None, 1, 4),
    "graded": lambda s: POLICIES["graded"](tuple((*h, 1.0) for h in CORE), budget=0.2, sink=1),
    "sap": lambda s: POLICIES["sap"]("noise", "all", convention="logits", seed=3),
}
# name -> its empty head set, where `NAME()` is not it (`hybrid`: no head streams).
NEUTRAL: dict[str, Callable[[SimpleNamespace], Policy]] = {
    "mean": lambda s: POLICIES["mean"](means=s.means),
    "hybrid": lambda s: POLICIES["hybrid"](_every_head(s), 1, 4, decode="stream"),
    "adaptive-hybrid": lambda s: POLICIES["adaptive-hybrid"](1.0, None, 1, 4),
    "graded": lambda s: POLICIES["graded"](budget=1.0, sink=1),
    "sap": lambda s: POLICIES["sap"](),  # the model's own attention as its prior
}


def example(name: str, shape=SHAPE) -> Policy:
    cls = POLICIES[name]
    if name in EXAMPLES:
        return EXAMPLES[name](shape)
    return cls(heads=CORE) if issubclass(cls, HeadsPolicy) else cls()


def neutral(name: str, shape=SHAPE) -> Policy:
    return NEUTRAL[name](shape) if name in NEUTRAL else POLICIES[name]()


def changes_the_answer(name: str) -> bool:
    """Whether `example(name)` is known to change the organism (so the no-op check beside it can fail)."""
    return name in EXAMPLES or issubclass(POLICIES[name], HeadsPolicy)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_is_its_json_and_equal_policies_are_equal(name):
    for policy in (example(name), neutral(name)):
        data = policy.to_dict()
        assert data["name"] == name and POLICIES[name] is type(policy)
        for again in (
            Policy.from_json(policy.to_json()),
            Policy.from_dict(data),
            copy.deepcopy(policy),
            dataclasses.replace(policy),
        ):
            assert type(again) is type(policy) and again == policy and again.to_dict() == data
            with contextlib.suppress(TypeError):  # a dict field (meta): unhashable, as a dict is
                assert hash(again) == hash(policy)
    assert example(name) != neutral(name) or not changes_the_answer(name)


@pytest.fixture(scope="module")
def organism(tmp_path_factory):
    """The organism, one prepared image prompt and its sample, and a means file of its shape."""
    m = cl.load(organism_path(), device="cpu")
    folder = tmp_path_factory.mktemp("invariants")
    samples, _ = read_samples(generate("image", folder, 1, seed=1))
    rng = np.random.default_rng(0)
    stats = [rng.normal(size=(m.num_layers, m.num_heads, m.text_config.head_dim)) for _ in range(2)]
    means = HeadMeans(*stats, 1, 1).save(folder / "means.npz")
    shape = SimpleNamespace(layers=m.num_layers, heads=m.num_heads, means=str(means))
    return m, samples[0], prepare(m, samples[0]), shape


def _logits(m, prepared, sample, policy=None) -> torch.Tensor:
    with torch.no_grad():
        if policy is None:
            return m.model(**prepared.inputs).logits
        with policy.applied(m, prepared, sample=sample):
            return m.model(**prepared.inputs).logits


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_an_empty_head_set_changes_nothing(name, organism):
    m, sample, prepared, shape = organism
    plain = _logits(m, prepared, sample)
    empty = neutral(name, shape)
    gap = (_logits(m, prepared, sample, empty) - plain).abs().max().item()
    assert gap <= 1e-4, f"{empty} changes the logits by {gap}: give {name} its empty head set in NEUTRAL"
    answer = cl.answer(m, prepared, None, sample=sample, max_new_tokens=2)
    assert cl.answer(m, prepared, empty, sample=sample, max_new_tokens=2) == answer
    if changes_the_answer(name):  # the same comparison sees a policy that does something
        assert (_logits(m, prepared, sample, example(name, shape)) - plain).abs().max().item() > 1e-3


def _hooks_now() -> dict[int, list]:
    return {module: list(hooks) for module, (_, hooks) in dispatch._active.items()}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_applied_leaves_no_hook_behind(name, organism):
    m, sample, prepared, shape = organism
    before = _hooks_now()
    policy = example(name, shape)
    with policy.applied(m, prepared, sample=sample) as on:
        inside = _hooks_now()
        assert on.hooks and inside != before  # the check sees the policy's hooks while applied
    assert _hooks_now() == before
    assert all(not dispatch.active_hooks(module) for _, module in m.layer_modules())
    with pytest.raises(RuntimeError, match="inside"), policy.applied(m, prepared, sample=sample):
        raise RuntimeError("inside")
    assert _hooks_now() == before
