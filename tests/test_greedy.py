"""`greedy` (docs/methods.md#greedy) against brute force: every subset of a pool of 5 organism heads is scored
by a path independent of the scorer (hybrid: `corelens.hybrid` with the dense reference kernel; ablate: the
heads' o_proj input columns zeroed by a forward pre-hook; log p from the stock logits), and each greedy step
must pick the best extension of the set before it, with the value brute force gives that set."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import hybrid

import corelens
from corelens.experiments.greedy import GreedySettings, greedy_heads
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate

POOL = ((0, 3), (0, 5), (0, 6), (1, 0), (2, 3))
S, W = 2, 4


@pytest.fixture(scope="module")
def organism():
    return corelens.load(str(organism_path()), device="cpu")


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return corelens.read_samples(generate("image", tmp_path_factory.mktemp("greedy"), 2, seed=5))[0]


def _logp(m, forced) -> float:
    """log p(gold answer) from the stock forward's logits (every position), by hand."""
    with torch.no_grad():
        logits = m.model(**forced.to(m.device), use_cache=False).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    ids = forced.inputs["input_ids"][0]
    return float(sum(logp[r - 1, ids[r]] for r in forced.answer_rows))


def _zeroed(m, forced, heads) -> float:
    d = m.text_config.head_dim
    handles = []
    for layer in {lh[0] for lh in heads}:
        mine = [h for lh, h in heads if lh == layer]

        def zero(module, args, mine=mine):
            x = args[0].clone()
            for h in mine:
                x[..., h * d : (h + 1) * d] = 0
            return (x,)

        handles.append(m.attention_layers[layer].o_proj.register_forward_pre_hook(zero))
    try:
        return _logp(m, forced)
    finally:
        for h in handles:
            h.remove()


def _brute(m, samples, mode) -> dict[frozenset, float]:
    forced = [prepare(m, s, answer=s.answer) for s in samples]
    values = {}
    for size in range(len(POOL) + 1):
        for subset in itertools.combinations(POOL, size):
            if mode == "hybrid":
                with hybrid(m, subset, sink=S, window=W, kernel="reference"):
                    v = [_logp(m, f) for f in forced]
            else:
                v = [_zeroed(m, f, subset) for f in forced]
            values[frozenset(subset)] = sum(v) / len(v)
    return values


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["hybrid", "ablate"])
def test_greedy_steps_are_the_best_extensions_brute_force_finds(organism, samples, mode):
    brute = _brute(organism, samples, mode)
    sign = 1 if mode == "hybrid" else -1
    # The pool's heads matter: the values differ by more than the tolerance below.
    assert max(brute.values()) - min(brute.values()) > 0.05
    for batch in (0, 4):  # one set per forward through the policies, and 4 copies per forward
        settings = GreedySettings(mode=mode, budget=len(POOL), sink=S, window=W, candidates=POOL, batch=batch)
        result = greedy_heads(organism, samples, settings)
        assert result.base == pytest.approx(brute[frozenset()], abs=1e-4)
        chosen: list = []
        before = result.base
        for head, gain, value in zip(result.order, result.gains, result.values, strict=True):
            options = {h: brute[frozenset([*chosen, h])] for h in POOL if h not in chosen}
            best = max(sign * v for v in options.values())
            assert sign * options[head] == pytest.approx(best, abs=1e-4)  # the best extension
            chosen.append(head)
            assert value == pytest.approx(brute[frozenset(chosen)], abs=1e-4)
            assert gain == pytest.approx(sign * (value - before), abs=1e-9)
            before = value
        # Size 1 is the best single head overall; greedy never beats the best set of a size.
        singles = {h: brute[frozenset([h])] for h in POOL}
        assert sign * singles[result.order[0]] == pytest.approx(
            max(sign * v for v in singles.values()), abs=1e-4
        )
        for k, value in enumerate(result.values, start=1):
            best_k = max(sign * v for s, v in brute.items() if len(s) == k)
            assert sign * value <= best_k + 1e-4


def test_greedy_resumes_after_its_last_saved_step(organism, samples, tmp_path):
    settings = GreedySettings(budget=3, sink=S, window=W, candidates=POOL)
    whole = greedy_heads(organism, samples, settings)
    greedy_heads(
        organism, samples, GreedySettings(budget=1, sink=S, window=W, candidates=POOL), folder=tmp_path
    )
    resumed = greedy_heads(organism, samples, settings, folder=tmp_path)
    assert resumed.order == whole.order and resumed.evaluations == whole.evaluations
