"""How hooks stack (corelens.attention.dispatch): the combinations that compose, each checked against a
reference built without the stacking code, and the ones refused by name."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from helpers import hybrid

import corelens
from corelens.attention import RamProbe, activate
from corelens.attention.dispatch import AttentionHook
from corelens.attention.priors import SapHook
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.capture import _NoRope
from corelens.errors import CorelensError
from corelens.policies import POLICIES

HEADS = [(0, 1), (1, 2)]  # ablated heads
FULL = [(0, 0), (1, 3)]  # hybrid full heads
SINK, WINDOW = 3, 7


@pytest.fixture(scope="module")
def model(tiny_dir):
    m = corelens.load(tiny_dir("qwen2_5_vl"))
    ids = torch.randint(20, 60, (1, 41), generator=torch.Generator().manual_seed(3))
    return m, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _logits(m, inputs):
    with torch.no_grad():
        return m.model(**inputs, use_cache=False).logits


def _per_head_hook(m, where, heads, fn):
    """Register hooks on q_proj outputs ("q") or o_proj inputs ("o") that zero head slices; return handles."""
    d = m.text_config.head_dim
    handles = []
    for layer in sorted({lh[0] for lh in heads}):
        mine = [h for lh_layer, h in heads if lh_layer == layer]

        def zero(x, mine=mine):
            x = x.clone()
            for h in mine:
                x[..., h * d : (h + 1) * d] = 0
            return x

        attn = m.attention_layers[layer]
        if where == "q":
            handles.append(attn.q_proj.register_forward_hook(lambda mod, a, out, z=zero: z(out)))
        else:
            handles.append(attn.o_proj.register_forward_pre_hook(lambda mod, a, z=zero: (z(a[0]),)))
    return handles


def _with(m, handles, fn):
    try:
        return fn()
    finally:
        for h in handles:
            h.remove()


def _hybrid(m):
    return hybrid(m, FULL, sink=SINK, window=WINDOW)


def _ablated(m, op):
    """The head operator `op` on HEADS, applied (zero and uniform need no prompt positions)."""
    return POLICIES[op](tuple(HEADS)).applied(m)


@pytest.mark.parametrize("op", ["zero", "uniform"])
@pytest.mark.parametrize("hybrid_outer", [True, False])
def test_ablation_inside_or_around_hybrid_attention(model, op, hybrid_outer):
    m, inputs = model
    # Reference: hybrid attention alone (itself tested against the dense masked reference), with the head
    # slices zeroed by ordinary torch hooks outside the attention function.
    with _hybrid(m) as h:
        ref = _with(
            m, _per_head_hook(m, "o" if op == "zero" else "q", HEADS, None), lambda: _logits(m, inputs)
        )
    assert h.stats["prefill:blocked"] == m.num_layers  # the pattern does stream
    first, second = (_hybrid(m), _ablated(m, op)) if hybrid_outer else (_ablated(m, op), _hybrid(m))
    with first, second:
        got = _logits(m, inputs)
    assert (got - ref).abs().max().item() <= 1e-5
    assert (got - _logits(m, inputs)).abs().max().item() > 1e-3


def test_sap_inside_zero_ablation(model):
    m, inputs = model
    n = inputs["input_ids"].shape[1]
    visual = torch.arange(5, 30)
    prior = torch.softmax(torch.linspace(-2, 2, len(visual)), 0)
    layers = [(i, m.attention_layers[i]) for i in range(m.num_layers)]

    @contextmanager
    def sap():
        with (
            attention_context(AttentionContext(visual, prompt_len=n)),
            activate(layers, SapHook(prior=prior)),
        ):
            yield

    with sap():
        ref = _with(m, _per_head_hook(m, "o", HEADS, None), lambda: _logits(m, inputs))
        alone = _logits(m, inputs)
    for outer, inner in (
        (lambda: _ablated(m, "zero"), sap),
        (sap, lambda: _ablated(m, "zero")),
    ):
        with outer(), inner():
            got = _logits(m, inputs)
        assert (got - ref).abs().max().item() <= 1e-5
    assert (alone - _logits(m, inputs)).abs().max().item() > 1e-4  # SAP does change the last row


@pytest.mark.parametrize("probe_outer", [True, False])
@pytest.mark.parametrize("op", ["zero", "uniform"])
def test_ram_probe_under_an_ablation_reads_the_ablated_attention(model, op, probe_outer):
    m, inputs = model
    n = inputs["input_ids"].shape[1]

    def probe():
        return RamProbe(
            m.num_layers, m.num_heads, torch.arange(n - 4, n), torch.arange(5, 15), torch.arange(5, 30), n
        )

    ref = probe()
    with activate(m.layer_modules(), ref):
        _with(m, _per_head_hook(m, "o" if op == "zero" else "q", HEADS, None), lambda: _logits(m, inputs))
    got = probe()
    scopes = [lambda: activate(m.layer_modules(), got), lambda: _ablated(m, op)]
    with scopes[not probe_outer](), scopes[probe_outer]():
        _logits(m, inputs)
    torch.testing.assert_close(got.mass, ref.mass, rtol=0, atol=1e-6)
    if op == "uniform":  # a zeroed query attends uniformly: row i puts |Ω ∩ [0, i]| / (i + 1) on Ω
        want = sum(min(max(i - 4, 0), 10) / (i + 1) for i in range(n - 4, n)) / 4
        assert got.mass[0, 1].item() == pytest.approx(want, abs=1e-6)


def _ablator(m, op):
    return POLICIES[op](tuple(HEADS)).hooks(m, None)[0]


@pytest.mark.parametrize(
    ("outer", "inner", "match"),
    [
        ("hybrid", "knockout", "both change the attention pattern"),
        ("knockout", "hybrid", "both change the attention pattern"),
        ("hybrid", "hybrid", "both change the attention pattern"),
        ("hybrid", "sap", "both change the attention pattern"),
        ("sap", "knockout", "both change the attention pattern"),
        ("probe", "hybrid", "stock causal pattern"),
        ("hybrid", "probe", "stock causal pattern"),
        ("knockout", "probe", "stock causal pattern"),
        ("sap", "probe", "stock causal pattern"),
        ("uniform", "norope", "before the ablation zeroes them"),
        ("norope", "uniform", "before the ablation zeroes them"),
    ],
)
def test_refused_combinations_name_both_hooks(model, outer, inner, match):
    m, inputs = model
    n = inputs["input_ids"].shape[1]
    layers = m.layer_modules()

    def hook(kind) -> AttentionHook:
        return {
            "hybrid": lambda: (
                corelens.attention.streaming.Hybrid(m, corelens.attention.streaming.as_plan(FULL)).hook
            ),
            "knockout": lambda: _ablator(m, "knockout"),
            "uniform": lambda: _ablator(m, "uniform"),
            "sap": lambda: SapHook(),
            "probe": lambda: RamProbe(2, 4, torch.arange(3), torch.arange(2), torch.arange(4), n),
            "norope": _NoRope,
        }[kind]()

    a, b = hook(outer), hook(inner)
    with activate(layers, a), pytest.raises(CorelensError, match=match) as err, activate(layers, b):
        pass
    assert a.name in str(err.value) and b.name in str(err.value)
    assert corelens.attention.dispatch.active_hooks(layers[0][1]) == []  # nothing left active


def test_hybrid_keeps_the_inner_kernel_where_every_pair_is_kept(model):
    """A dense hybrid call runs the inner kernel: a knockout-like wrapper inside is not silently dropped."""
    m, inputs = model
    seen = []

    class Count(AttentionHook):
        kind = "output"

        def attend(self, call, inner):
            def kernel(*args, **kwargs):
                seen.append(call.layer)
                return inner(*args, **kwargs)

            return kernel

    with hybrid(m, FULL, sink=SINK, window=1000), activate(m.layer_modules(), Count()):
        _logits(m, inputs)
    assert seen == list(range(m.num_layers))
