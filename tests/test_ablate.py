"""Causal interventions (docs/methods.md#interventions): each operator against an independent reference, head sets, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import noise_image

import corelens
from corelens.attention import RamProbe, activate
from corelens.attention.interventions import HeadMeans
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample, Target
from corelens.experiments.ablate import reference_means
from corelens.metrics.headsets import head_sets, k_count, select
from corelens.models.prepare import prepare
from corelens.models.tiny import ALL_FAMILIES
from corelens.policies import POLICIES, KnockoutHeads, MeanHeads, Policy, UniformHeads, ZeroHeads
from corelens.policies.legacy import ablation_policy

HEADS = [(0, 1), (1, 0), (1, 3)]
GEN = {"max_new_tokens": 4, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
# (family, kv_heads): every registered family, GQA groups of 2 and 4 query heads in turn.
CASES = [(family, 2 if i % 2 == 0 else 1) for i, family in enumerate(ALL_FAMILIES)]


def _sample(tmp_path, seed: int = 0, name: str = "s") -> Sample:
    path = tmp_path / f"{name}{seed}.png"
    noise_image(180, 150, seed=seed).save(path)
    return Sample(
        f"{name}{seed}", "image", "what is the colour of the cup ?", images=(path,), answer="red",
        targets=(Target("box", image=0, box=(20.0, 30.0, 100.0, 90.0)),), image_sizes=((180, 150),),
    )  # fmt: skip


def _forward(m, inputs, **kw):
    with torch.no_grad():
        return m.model(**inputs, **kw).logits


def _generate(m, inputs):
    with torch.no_grad():
        return m.model.generate(**inputs, **GEN)


def _same_generation(a, b, atol=1e-5):
    assert torch.equal(a.sequences, b.sequences)
    for sa, sb in zip(a.scores, b.scores):
        assert (sa - sb).abs().max().item() <= atol


def _o_proj_pre(m, heads, replace):
    """Register forward pre-hooks on o_proj that call replace(layer, head, slice) -> new slice."""
    d = m.text_config.head_dim
    handles = []
    for layer in sorted({lh[0] for lh in heads}):
        mine = [h for lh_layer, h in heads if lh_layer == layer]

        def hook(module, args, layer=layer, mine=mine):
            x = args[0].clone()
            for h in mine:
                x[..., h * d : (h + 1) * d] = replace(layer, h, x[..., h * d : (h + 1) * d])
            return (x,)

        handles.append(m.attention_layers[layer].o_proj.register_forward_pre_hook(hook))
    return handles


def _remove(handles):
    for h in handles:
        h.remove()


@pytest.mark.parametrize(("family", "kv"), CASES)
def test_zero_equals_o_proj_input_zeroed(tiny_dir, family, kv, tmp_path):
    m = corelens.load(tiny_dir(family, kv_heads=kv))
    inputs = prepare(m, _sample(tmp_path)).inputs
    plain = _forward(m, inputs)
    with ZeroHeads(HEADS).applied(m):
        ours, ours_gen = _forward(m, inputs), _generate(m, inputs)
    handles = _o_proj_pre(m, HEADS, lambda layer, h, x: torch.zeros_like(x))
    try:
        ref, ref_gen = _forward(m, inputs), _generate(m, inputs)
    finally:
        _remove(handles)
    assert (ours - ref).abs().max().item() <= 1e-5
    assert (ours - plain).abs().max().item() > 1e-3  # the ablation does something
    _same_generation(ours_gen, ref_gen)
    assert torch.equal(_forward(m, inputs), plain)  # and is gone after the block


def _zero_q_proj(m, heads):
    """Zero head h's slice of q_proj's output: RoPE (and Qwen3's q_norm) keep a zero query zero."""
    d = m.text_config.head_dim
    handles = []
    for layer in sorted({lh[0] for lh in heads}):
        mine = [h for lh_layer, h in heads if lh_layer == layer]

        def hook(module, args, out, mine=mine):
            out = out.clone()
            for h in mine:
                out[..., h * d : (h + 1) * d] = 0
            return out

        handles.append(m.attention_layers[layer].q_proj.register_forward_hook(hook))
    return handles


@pytest.mark.parametrize(("family", "kv"), CASES)
def test_uniform_equals_zeroed_queries(tiny_dir, family, kv, tmp_path):
    m = corelens.load(tiny_dir(family, kv_heads=kv))
    inputs = prepare(m, _sample(tmp_path)).inputs
    padded = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    padded["attention_mask"][0, :3] = 0  # an explicit (padding) mask reaches the kernel
    with UniformHeads(HEADS).applied(m):
        ours, ours_pad, ours_gen = _forward(m, inputs), _forward(m, padded), _generate(m, inputs)
    handles = _zero_q_proj(m, HEADS)
    try:
        ref, ref_pad, ref_gen = _forward(m, inputs), _forward(m, padded), _generate(m, inputs)
    finally:
        _remove(handles)
    assert (ours - ref).abs().max().item() <= 1e-5
    assert (ours_pad - ref_pad).abs().max().item() <= 1e-5
    _same_generation(ours_gen, ref_gen)


def test_uniform_attention_is_uniform_over_causal_keys(tiny_dir, tmp_path):
    m = corelens.load(tiny_dir("qwen2_5_vl", kv_heads=1))
    p = prepare(m, _sample(tmp_path))
    n, rows = p.seq_len, torch.tensor([10, p.seq_len - 1])
    omega = torch.arange(0, 40)
    probe = RamProbe(2, 4, rows, omega, omega, n)
    with UniformHeads([(0, 2)]).applied(m), activate(m.layer_modules(), probe), torch.no_grad():
        m.model(**p.inputs)
    expected = ((omega[None, :] <= rows[:, None]).sum(1) / (rows + 1)).mean()
    assert probe.mass[0, 2].item() == pytest.approx(expected.item(), abs=1e-6)
    assert abs(probe.mass[0, 1].item() - expected.item()) > 1e-4


def _position_ids(m, inputs):
    seen = {}

    def grab(module, args, kwargs):
        seen["position_ids"] = kwargs["position_ids"]

    handle = m.model.model.language_model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        _forward(m, inputs)
    finally:
        handle.remove()
    return seen["position_ids"]


def _masked_reference(m, inputs, keys):
    """Inputs whose padding mask hides `keys` from every query of every head, with the original positions."""
    ref = dict(inputs, position_ids=_position_ids(m, inputs), attention_mask=inputs["attention_mask"].clone())
    ref["attention_mask"][0, torch.as_tensor(keys)] = 0
    return ref


@pytest.mark.parametrize("kv", [2, 1])
def test_knockout_of_all_heads_equals_a_padding_mask_over_the_key_set(tiny_dir, kv, tmp_path):
    m = corelens.load(tiny_dir("qwen2_5_vl", kv_heads=kv))
    sample = _sample(tmp_path)
    p = prepare(m, sample)
    every = [(layer, h) for layer in range(2) for h in range(4)]
    visual = p.layout.visual
    with KnockoutHeads(every).applied(m, p):  # the prompt's visual keys
        ours = _forward(m, p.inputs)
    ref = _forward(m, _masked_reference(m, p.inputs, visual))
    assert (ours - ref).abs().max().item() <= 1e-5
    omega = p.layout.omega(sample.targets)
    with KnockoutHeads(every, keys="omega").applied(m, p, sample=sample):
        ours = _forward(m, p.inputs)
    ref = _forward(m, _masked_reference(m, p.inputs, omega))
    assert (ours - ref).abs().max().item() <= 1e-5


def test_knockout_acts_on_its_heads_only(tiny_dir, tmp_path):
    m = corelens.load(tiny_dir("qwen2_5_vl", kv_heads=2))
    p = prepare(m, _sample(tmp_path))
    d = m.text_config.head_dim
    seen = {}

    def grab(name):
        def hook(module, args):
            seen[name] = args[0][0].clone()

        return m.attention_layers[0].o_proj.register_forward_pre_hook(hook)

    handle = grab("plain")
    _forward(m, p.inputs)
    handle.remove()
    handle = grab("ref")
    _forward(m, _masked_reference(m, p.inputs, p.layout.visual))
    handle.remove()
    handle = grab("ours")
    with KnockoutHeads([(0, 1), (0, 2)]).applied(m, p):
        _forward(m, p.inputs)
    handle.remove()
    for h in range(4):
        want = seen["ref"] if h in (1, 2) else seen["plain"]  # layer 0 sees the same input on every side
        got = seen["ours"][:, h * d : (h + 1) * d]
        assert (got - want[:, h * d : (h + 1) * d]).abs().max().item() <= 1e-5


def test_knockout_of_an_empty_key_set_is_a_no_op(tiny_dir, tmp_path):
    m = corelens.load(tiny_dir("qwen2_5_vl", kv_heads=1))
    inputs = prepare(m, _sample(tmp_path)).inputs
    plain, plain_gen = _forward(m, inputs), _generate(m, inputs)
    knockout = KnockoutHeads(HEADS, keys="omega")
    with knockout.applied(m), attention_context(AttentionContext((), omega=[])):
        assert torch.equal(_forward(m, inputs), plain)
        _same_generation(_generate(m, inputs), plain_gen, atol=0.0)
    no_omega = attention_context(AttentionContext(()))  # the prompt's positions, but not its Omega
    with (
        knockout.applied(m),
        no_omega,
        pytest.raises(corelens.CorelensError, match="needs the sample's Omega"),
    ):
        _forward(m, inputs)


def _greedy_without_cache(m, inputs, steps):
    """Greedy tokens by re-running the whole sequence at every step (no KV cache)."""
    step = dict(inputs)
    for _ in range(steps):
        nxt = _forward(m, step, use_cache=False)[:, -1].argmax(-1, keepdim=True)
        for name, value in (("input_ids", nxt), ("attention_mask", 1), ("mm_token_type_ids", 0)):
            if name in step:  # generated tokens are text
                tail = value if torch.is_tensor(value) else torch.full_like(nxt, value)
                step[name] = torch.cat([step[name], tail.to(step[name].dtype)], 1)
    return step["input_ids"]


@pytest.mark.parametrize("keys", ["visual", "omega"])
def test_knockout_with_cache_equals_no_cache(tiny_dir, keys, tmp_path):
    """The decoding steps knock out the same absolute key positions as the prefill."""
    from corelens.experiments.evaluate import evaluate

    m = corelens.load(tiny_dir("qwen2_5_vl", kv_heads=1))
    sample = _sample(tmp_path)
    p = prepare(m, sample)
    knockout = KnockoutHeads(HEADS, keys=keys)
    with knockout.applied(m, p, sample=sample):
        cached = _generate(m, p.inputs).sequences
        uncached = _greedy_without_cache(m, p.inputs, GEN["max_new_tokens"])
    if keys == "omega":  # the harness applies the policy with each sample's positions
        got = evaluate(m, [sample], max_new_tokens=GEN["max_new_tokens"], policy=knockout)
        new = cached[0, p.seq_len :]
        assert (
            got.records["prediction"][0]
            == m.processor.tokenizer.decode(new, skip_special_tokens=True).strip()
        )
    assert torch.equal(cached, uncached)


def _test_side_means(m, samples):
    """Per-role means of every head's o_proj input over the prompts of `samples`, by o_proj pre-hooks."""
    sums = {r: torch.zeros(2, 4, m.text_config.head_dim, dtype=torch.float64) for r in ("text", "visual")}
    counts = {"text": 0, "visual": 0}
    visual_ids = torch.tensor([m.model.config.image_token_id, m.model.config.video_token_id])
    for sample in samples:
        inputs = prepare(m, sample).inputs
        vis = torch.isin(inputs["input_ids"][0], visual_ids)
        counts["visual"] += int(vis.sum())
        counts["text"] += int((~vis).sum())

        def record(layer, h, x, vis=vis):
            x64 = x[0].double()
            sums["visual"][layer, h] += x64[vis].sum(0)
            sums["text"][layer, h] += x64[~vis].sum(0)
            return x

        handles = _o_proj_pre(m, [(layer, h) for layer in range(2) for h in range(4)], record)
        try:
            _forward(m, inputs)
        finally:
            _remove(handles)
    return {r: (sums[r] / counts[r]).numpy() for r in sums}


def test_mean_uses_reference_statistics_only(tiny_dir, tmp_path):
    m = corelens.load(tiny_dir("qwen2_5_vl", kv_heads=2))
    reference = [_sample(tmp_path, seed, "ref") for seed in (1, 2)]
    target = _sample(tmp_path, 7, "eval")
    means = reference_means(m, reference, meta={"note": "A"})
    want = _test_side_means(m, reference)
    np.testing.assert_allclose(means.text, want["text"], atol=1e-6)
    np.testing.assert_allclose(means.visual, want["visual"], atol=1e-6)
    assert means.meta["samples"] == ["ref1", "ref2"]
    other = _test_side_means(m, [*reference, target])
    assert np.abs(means.visual - other["visual"]).max() > 1e-4  # the evaluated sample would change them
    path = means.save(tmp_path / "means.npz")
    loaded = HeadMeans.load(path)
    np.testing.assert_array_equal(loaded.visual, means.visual)
    assert loaded.meta == means.meta and loaded.n_text == means.n_text

    p = prepare(m, target)
    before = means.visual.copy()
    with MeanHeads(HEADS, means=path).applied(m, p):
        ours, ours_gen = _forward(m, p.inputs), _generate(m, p.inputs)
    np.testing.assert_array_equal(means.visual, before)
    n = p.seq_len
    vis = torch.isin(p.inputs["input_ids"][0], torch.tensor([m.model.config.image_token_id]))

    def write(layer, h, x):
        text = torch.from_numpy(want["text"][layer, h]).float()
        visual = torch.from_numpy(want["visual"][layer, h]).float()
        if x.shape[1] != n:  # a decoding step: generated tokens are text
            return text.expand_as(x)
        return torch.where(vis[None, :, None], visual, text).expand_as(x)

    handles = _o_proj_pre(m, HEADS, write)
    try:
        ref, ref_gen = _forward(m, p.inputs), _generate(m, p.inputs)
    finally:
        _remove(handles)
    assert (ours - ref).abs().max().item() <= 1e-5
    _same_generation(ours_gen, ref_gen)


def test_an_ablation_policy_is_plain_data(tiny_dir):
    a = KnockoutHeads([(1, 3), (0, 1), (1, 3)], label="top/5%", keys="omega")
    assert a.heads == ((0, 1), (1, 3))
    assert Policy.from_json(a.to_json()) == a
    assert json.loads(a.to_json())["heads"] == [[0, 1], [1, 3]]
    with pytest.raises(ValueError, match="unknown policy 'erase'"):
        POLICIES["erase"]
    m = corelens.load(tiny_dir("qwen2_vl"))
    with pytest.raises(corelens.CorelensError, match="outside the model"), ZeroHeads([(2, 0)]).applied(m):
        pass
    with (
        pytest.raises(corelens.CorelensError, match="needs reference statistics"),
        MeanHeads([(0, 0)]).applied(m),
    ):
        pass


def _table(layers=4, heads=4):
    rng = np.random.default_rng(0)
    t = pd.DataFrame(
        [(layer, h, rng.random()) for layer in range(layers) for h in range(heads)],
        columns=["layer", "head", "mass"],
    )
    t["rank"] = t["mass"].rank(ascending=False, method="first").astype(int)
    return t


def test_head_sets_have_equal_size_and_are_deterministic():
    t = _table()
    assert (
        k_count("25%", 16) == 4 and k_count("1%", 16) == 1 and k_count("3", 16) == 3 and k_count(0.5, 16) == 8
    )
    with pytest.raises(corelens.CorelensError):
        k_count("x", 16)
    sets = head_sets(t, ["25%", "6"], seeds=5)
    assert len(sets) == 2 * (2 + 5 + 5)
    top = {hs.k: set(hs.heads) for hs in sets if hs.kind == "top"}
    assert top["25%"] == set(map(tuple, t.nsmallest(4, "rank")[["layer", "head"]].to_numpy().tolist()))
    for hs in sets:
        assert len(set(hs.heads)) == hs.count == (4 if hs.k == "25%" else 6)
        if hs.kind == "random":
            assert hs.overlap == len(set(hs.heads) & top[hs.k])  # drawn from all heads
        if hs.kind == "layer-matched":
            per_layer = lambda s: sorted(layer for layer, _ in s)  # noqa: E731
            assert per_layer(hs.heads) == per_layer(top[hs.k]) and hs.overlap == hs.short_by == 0
    bottom = select(t, "bottom", 4)
    assert set(bottom) == set(map(tuple, t.nlargest(4, "rank")[["layer", "head"]].to_numpy().tolist()))
    draws = {select(t, "random", 4, s) for s in range(5)}
    assert len(draws) > 1 and select(t, "random", 4, 3) == select(t, "random", 4, 3)
    assert head_sets(t, ["25%"], seeds=5) == head_sets(t, ["25%"], seeds=5)


def test_controls_random_from_all_heads_and_layer_matched_without_top_heads():
    # Two layers of three heads, ranked L0H0 > L0H1 > L0H2 > L1H0 > L1H1 > L1H2.
    t = pd.DataFrame({"layer": [0, 0, 0, 1, 1, 1], "head": [0, 1, 2, 0, 1, 2], "rank": [1, 2, 3, 4, 5, 6]})
    everything = {(layer, h) for layer in range(2) for h in range(3)}
    # Layer-matched: each layer's count of top heads, from that layer's other heads only.
    assert select(t, "layer-matched", 2, 0) == ((0, 2),)  # layer 0 has one other head for two top heads
    assert select(t, "layer-matched", 3, 0) == ()  # every layer-0 head is a top head
    assert {select(t, "layer-matched", 4, s) for s in range(4)} == {((1, 2),)}
    assert {select(t, "layer-matched", 1, s) for s in range(8)} == {((0, 1),), ((0, 2),)}
    short = {(hs.k, hs.seed): hs.short_by for hs in head_sets(t, ["1", "2", "3", "4"], ["layer-matched"], 2)}
    assert short == {("1", 0): 0, ("1", 1): 0, ("2", 0): 1, ("2", 1): 1, ("3", 0): 3, ("3", 1): 3,
                     ("4", 0): 3, ("4", 1): 3}  # fmt: skip
    # Random from all heads: at k = N/2 it is not the bottom set, and top heads come up by chance.
    draws = [select(t, "random", 3, s) for s in range(4)]
    assert draws == [((0, 0), (0, 2), (1, 0)), ((0, 0), (1, 0), (1, 1)), ((1, 0), (1, 1), (1, 2)),
                     ((0, 0), (0, 2), (1, 2))]  # fmt: skip
    assert set().union(*(select(t, "random", 3, s) for s in range(8))) == everything
    # Outside the top-k only (the old rule): at k = N/2 every draw is the bottom set.
    outside = {select(t, "random", 3, s, random_from="non-top") for s in range(4)}
    assert outside == {select(t, "bottom", 3)} == {((1, 0), (1, 1), (1, 2))}
    assert select(t, "random", 4, 0, random_from="non-top") == ((1, 1), (1, 2))  # two heads short
    with pytest.raises(corelens.CorelensError, match="random-from"):
        select(t, "random", 2, 0, random_from="bottom")


@pytest.mark.e2e
def test_cli_sweep_writes_table_and_figure_resumes_and_warns(tiny_dir, tmp_path, capsys, monkeypatch):
    import corelens.experiments.policy_sweep as experiment  # the sweeps answer through its `answer`
    from corelens.cli import main
    from corelens.organism.tasks import generate

    model = tiny_dir("qwen2_5_vl", kv_heads=2)
    ident = generate("image", tmp_path / "ident", 2, seed=1)
    data = generate("image", tmp_path / "eval", 2, seed=2)
    rank = tmp_path / "rank"
    assert main(["rank", "--model", str(model), "--data", str(ident), "--out", str(rank)]) == 0
    heads = rank / "heads.csv"
    calls = []
    real = experiment.answer
    monkeypatch.setattr(experiment, "answer", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    out = tmp_path / "ablate"
    cli = ["ablate", "--model", str(model), "--heads", str(heads), "--max-new-tokens", "2"]
    sweep = [*cli, "--data", str(data), "--k", "12.5%,25%", "--seeds", "2", "--out", str(out)]
    capsys.readouterr()
    assert main(sweep) == 0
    assert "warning" not in capsys.readouterr().err
    table = pd.read_csv(out / "ablation.csv")
    assert list(table.columns) == [
        "set", "k", "k_heads", "seed", "op", "keys", "accuracy", "n", "correct", "ci_low", "ci_high", "overlap",
        "short_by", "granularity", "query_heads", "kv_heads", "heads",
    ]  # fmt: skip
    assert len(table) == 1 + 2 * (1 + 1 + 2 + 2) and (table["n"] == 2).all() and (table["op"] == "zero").all()
    assert sorted(table.loc[table["set"] == "top", "k_heads"]) == [1, 2]
    assert table.loc[table["set"] == "random", "seed"].tolist() == [0, 1, 0, 1]
    assert ((table["ci_low"] <= table["accuracy"]) & (table["accuracy"] <= table["ci_high"])).all()
    assert (out / "figures" / "dose_response.png").stat().st_size > 5000
    records = pd.read_parquet(out / "records.parquet")
    assert len(records) == 13 * 2 and {"prediction", "gold", "correct"} <= set(records.columns)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["seeds"] == [0, 1] and manifest["settings"]["identified_sha256"]
    sets = json.loads((out / "headsets.json").read_text())
    assert len(sets) == 13 and ablation_policy({k: v for k, v in sets[1].items() if k != "name"}).heads
    named = [" ".join(f"L{layer}H{head}" for layer, head in sorted(map(tuple, s["heads"]))) for s in sets[1:]]
    assert table["heads"].iloc[1:].tolist() == named  # each row names the heads it ablated
    summary = pd.read_csv(out / "ablation_summary.csv")
    drawn = summary["set"].isin(["random", "layer-matched"])
    assert (summary.loc[drawn, "interval"] == "widest of draws (few draws)").all()  # 2 draws each
    assert (summary.loc[~drawn, "interval"] == "wilson").all()
    first_calls = len(calls)
    assert first_calls <= 13 * 2  # equal head sets share one generation

    log = out / "samples.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:12]) + '\n{"id": "top/12.5%|ima')  # killed mid-write
    before = (out / "ablation.csv").read_bytes()
    calls.clear()
    assert main(sweep) == 0
    assert (out / "ablation.csv").read_bytes() == before
    ids = [json.loads(line)["id"] for line in log.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 26 and 0 < len(calls) < first_calls
    assert json.loads((out / "manifest.json").read_text())["resumed"] == 1

    same = [
        *cli,
        "--data",
        str(ident),
        "--k",
        "1",
        "--sets",
        "top",
        "--op",
        "mean",
        "--out",
        str(tmp_path / "s"),
    ]
    assert main(same) == 0
    assert "identified on the same data" in capsys.readouterr().err
    assert (tmp_path / "s" / "means.npz").is_file()
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["warnings"]
    knock = [*cli, "--data", str(data), "--k", "2", "--sets", "top", "--op", "knockout", "--keys", "omega"]
    assert main([*knock, "--limit", "1", "--out", str(tmp_path / "k")]) == 0
    assert pd.read_csv(tmp_path / "k" / "ablation.csv")["keys"].tolist() == ["omega", "omega"]
