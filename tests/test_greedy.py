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


KV_POOL = ((0, 0), (0, 1), (1, 0), (2, 1))  # KV heads (layer, kv head) of the organism: 4 query heads each


@pytest.mark.e2e
def test_kv_greedy_selects_whole_kv_heads_as_brute_force_finds(organism, samples):
    """granularity "kv": each unit is a KV head, its 4 query heads kept full together; every step is the best
    extension among the 16 subsets of whole KV heads, scored by the reference hybrid path."""
    forced = [prepare(organism, s, answer=s.answer) for s in samples]
    group = organism.num_heads // organism.num_kv_heads

    def value(units) -> float:
        heads = [(layer, kv * group + j) for layer, kv in units for j in range(group)]
        with hybrid(organism, heads, sink=S, window=W, kernel="reference"):
            return sum(_logp(organism, f) for f in forced) / len(forced)

    brute = {
        frozenset(c): value(c) for n in range(len(KV_POOL) + 1) for c in itertools.combinations(KV_POOL, n)
    }
    assert max(brute.values()) - min(brute.values()) > 0.05
    settings = GreedySettings(budget=3, sink=S, window=W, candidates=KV_POOL, batch=4, granularity="kv")
    result = greedy_heads(organism, samples, settings)
    chosen: list = []
    for unit, value_after in zip(result.order, result.values, strict=True):
        options = {u: brute[frozenset([*chosen, u])] for u in KV_POOL if u not in chosen}
        assert options[unit] == pytest.approx(max(options.values()), abs=1e-4)
        chosen.append(unit)
        assert value_after == pytest.approx(brute[frozenset(chosen)], abs=1e-4)
    assert list(result.table().columns[:3]) == ["rank", "layer", "kv_head"]


def test_rank_score_greedy_kv_gives_each_query_head_its_kv_heads_score(organism, tmp_path):
    """`rank --score greedy --granularity kv`: the selection is of KV heads, recorded in the scorer's settings."""
    import json

    import pandas as pd

    data = generate("image", tmp_path / "data", 2, seed=5)
    score = {"name": "greedy", "sink": str(S), "window": str(W), "greedy_budget": 2, "granularity": "kv"}
    ranking = corelens.rank(organism, data, score=score, granularity="kv", k=None, out=tmp_path / "run")
    picked = pd.read_csv(tmp_path / "run" / "greedy.csv")
    assert list(picked.columns[:3]) == ["rank", "layer", "kv_head"] and len(picked) == 2
    assert ranking.top(2) == list(zip(picked["layer"], picked["kv_head"], strict=True))
    per_query = ranking.ram.groupby(["layer", "head"])["mass"].first().to_numpy().reshape(4, 8)
    assert (per_query.reshape(4, 2, 4) == per_query.reshape(4, 2, 4)[..., :1]).all()  # one score per KV group
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["settings"]["score"]["granularity"] == "kv"
