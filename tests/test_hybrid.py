"""Hybrid attention on real (tiny) Qwen-VL models: stock parity, reference parity, trimmed-cache decoding, policy."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import hybrid, noise_image

import corelens
from corelens.attention.streaming import HybridPlan, as_plan
from corelens.data.sample import Sample
from corelens.deprecation import CorelensDeprecationWarning
from corelens.errors import CorelensError
from corelens.models.prepare import prepare
from corelens.models.tiny import load_tiny
from corelens.policies import HybridAttention, Policy

OLD = Path(__file__).resolve().parent / "data" / "old_formats"  # written by the code before HybridPlan

# GQA group size -> tiny config (Qwen2.5-VL derives head_dim = hidden / heads = 16).
GROUPS = {
    1: {"heads": 4, "kv_heads": 4},
    2: {"heads": 4, "kv_heads": 2},
    3: {"heads": 6, "kv_heads": 2, "hidden": 96},
    4: {"heads": 4, "kv_heads": 1},
}


def _prompt(n_tokens, batch, pad, seed=0):
    """Return text-only ids (no special tokens) and a left-padded attention mask (row 1 padded by `pad`)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(20, 60, (batch, n_tokens), generator=g)
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :pad] = 0
    return ids, mask


def _policy(layers, heads, seed):
    g = torch.Generator().manual_seed(seed)
    flags = torch.rand(layers, heads, generator=g) < 0.35
    return [tuple(p) for p in flags.nonzero().tolist()]


def test_all_full_or_wide_window_is_the_stock_model(tiny_dir, any_family, tmp_path):
    path = tiny_dir(any_family)
    m = corelens.load(path)
    stock, _ = load_tiny(path)
    image = tmp_path / "im.png"
    noise_image(301, 173).save(image)
    sample = Sample(
        "s", "image", "what is the colour of the cup ?", images=(image,), image_sizes=((301, 173),)
    )
    inputs = prepare(m, sample).inputs
    n = inputs["input_ids"].shape[1]
    every = [(layer, head) for layer in range(m.num_layers) for head in range(m.num_heads)]
    with torch.no_grad():
        ref = stock(**inputs).logits
        with hybrid(m, every, sink=2, window=3):
            full = m.model(**inputs).logits
        with hybrid(m, [], sink=0, window=n):
            wide = m.model(**inputs).logits
        with hybrid(m, [], sink=4, window=5, kernel="reference"):
            narrow = m.model(**inputs).logits
    assert (full - ref).abs().max().item() <= 1e-5
    assert (wide - ref).abs().max().item() <= 1e-5
    assert (narrow - ref).abs().max().item() > 1e-3  # the pattern does bite when W < N


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
def test_any_policy_equals_the_dense_masked_reference(tiny_dir, groups):
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[groups]))
    ids, mask = _prompt(157, 2, 23, seed=groups)  # 157: a multiple of no block size
    policy = _policy(m.num_layers, m.num_heads, seed=groups)
    outs = {}
    with torch.no_grad():
        for kernel in ("reference", "auto"):
            with hybrid(m, policy, sink=5, window=21, kernel=kernel) as h:
                outs[kernel] = m.model(input_ids=ids, attention_mask=mask).logits
            assert h.stats[f"prefill:{'reference' if kernel == 'reference' else 'blocked'}"] == m.num_layers
    real = mask.bool()
    assert (outs["auto"] - outs["reference"])[real].abs().max().item() <= 1e-5


@pytest.mark.parametrize("groups", [2, 3])
@pytest.mark.parametrize("pad", [9, 60])  # 60: row 1's one real token, so decoded tokens fill its sinks
def test_greedy_decoding_with_the_trimmed_cache(tiny_dir, groups, pad):
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[groups]))
    ids, mask = _prompt(61, 2, pad, seed=10 + groups)
    # A layer-0 KV head whose query heads all stream, one whose heads are all full, and mixed ones.
    policy = [(0, h) for h in range(groups)] + [(1, 0)]
    gen = {"max_new_tokens": 9, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad():
        with hybrid(m, policy, sink=3, window=8, kernel="reference", decode="stream") as ref_session:
            ref = m.model.generate(input_ids=ids, attention_mask=mask, **gen)  # DynamicCache, every key kept
        with hybrid(m, policy, sink=3, window=8, decode="stream") as h:
            cache = h.cache()
            out = m.model.generate(input_ids=ids, attention_mask=mask, cache=cache, **gen)
        # Teacher-forced dense reference over the whole generated sequence.
        full_mask = torch.cat([mask, torch.ones(2, 9, dtype=mask.dtype)], dim=1)
        with hybrid(m, policy, sink=3, window=8, kernel="reference"):
            forced = m.model(input_ids=ref.sequences, attention_mask=full_mask).logits
    assert ref_session.stats["masked"] > 0 and h.stats["trimmed"] > 0
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.scores, ref.scores):
        assert (a - b).abs().max().item() <= 1e-4
    n = ids.shape[1]
    assert torch.equal(forced[:, n - 1 : -1].argmax(-1), ref.sequences[:, n:])

    report = h.cache_report()
    layer = cache.layers[0]
    assert layer.trimmed and len(layer.stream_kv) == m.num_kv_heads - 1
    kept = layer.skeys.shape[2]
    assert kept == 3 + 8  # sinks + window slots, not every position
    dim = m.text_config.hidden_size // m.num_heads
    total = n + 8  # the cache holds every position but the last generated token
    streaming = sum(len(x.stream_kv) for x in cache.layers)
    slot_positions = sum(x.positions.numel() * 8 for x in cache.layers if x.trimmed)
    # batch 2, K and V, fp32; the streaming KV heads keep `kept` of `total` positions (+ their slot table).
    want = 2 * streaming * (total - kept) * 2 * dim * 4 - slot_positions
    assert report["saved_bytes"] == want and report["saved_fraction"] > 0


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("q_len", [1, 4])
def test_decode_attention_is_the_masked_reference_in_the_input_dtype(monkeypatch, groups, q_len):
    from corelens.attention.kernels.cache import decode_attention
    from corelens.attention.kernels.dense import masked_attention

    g = torch.Generator().manual_seed(groups * 10 + q_len)
    q = torch.randn(2, 2 * groups, q_len, 16, generator=g)
    k, v = torch.randn(2, 2, 2, 37, 16, generator=g).unbind(0)
    allowed = torch.rand(2, 2 * groups, q_len, 37, generator=g) < 0.4
    allowed[..., 5] = True  # every row keeps a key
    want = masked_attention(q, k, v, allowed, 0.25)
    assert (decode_attention(q, k, v, allowed, 0.25) - want).abs().max().item() <= 1e-5
    upcast = []
    to_float = torch.Tensor.float
    monkeypatch.setattr(
        torch.Tensor, "float", lambda t, *a, **kw: upcast.append(t.shape) or to_float(t, *a, **kw)
    )
    half = decode_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), allowed, 0.25)
    assert half.dtype == torch.bfloat16 and not upcast  # no fp32 copy of the cache
    assert (half.float() - want).abs().max().item() <= 3e-2


def _forced_decoding(m, policy, ids, mask, prompt, **options):
    """Return the last-position logits of a prefill of `prompt` tokens and of one step per further token."""
    logits = []
    with torch.no_grad(), hybrid(m, policy, sink=3, window=8, decode="stream", **options) as h:
        cache = h.cache() if options.get("kernel") != "reference" else None  # reference: a DynamicCache
        out = m.model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt], cache=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        for t in range(prompt, ids.shape[1]):
            out = m.model(
                input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=out.past_key_values
            )
            logits.append(out.logits[:, -1])
    return torch.stack(logits), h


@pytest.mark.parametrize("groups", [2, 3])
def test_forced_decoding_with_the_trimmed_cache_fills_late_sinks(tiny_dir, groups):
    # Row 1 has one real prompt token (position 60): its sinks 61 and 62 are written while decoding, and
    # distinct forced tokens (unlike a greedy loop that repeats one) make a missed sink visible.
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[groups]))
    ids, mask = _prompt(70, 2, 60, seed=12)
    mask[1, 61:] = 1
    policy = [(0, 0), (0, 1), (1, 0)]
    trimmed, h = _forced_decoding(m, policy, ids, mask, 61)
    dense, ref = _forced_decoding(m, policy, ids, mask, 61, kernel="reference")
    assert h.stats["trimmed"] == 9 * m.num_layers and ref.stats["masked"] == 9 * m.num_layers
    assert (trimmed - dense).abs().max().item() <= 1e-5
    assert h.last_cache.layers[0].positions[1, :3].tolist() == [60, 61, 62]


_HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def test_a_trimmed_decoding_step_reads_nothing_back(tiny_dir, monkeypatch):
    # The cache's write and the trimmed kernel of a decoding step run with every tensor-to-host read raising.
    from corelens.attention.kernels.cache import HybridCacheLayer
    from corelens.attention.streaming import HybridHook

    armed = []

    def guarded(fn):
        def run(*args, **kwargs):
            if not armed:
                return fn(*args, **kwargs)
            with pytest.MonkeyPatch.context() as patch:
                for name in _HOST_READS:
                    patch.setattr(torch.Tensor, name, _refuse(name))
                patch.setattr(torch, "nonzero", _refuse("torch.nonzero"))
                return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(HybridCacheLayer, "_update_trimmed", guarded(HybridCacheLayer._update_trimmed))
    monkeypatch.setattr(HybridHook, "_trimmed", guarded(HybridHook._trimmed))
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[2]))
    ids, mask = _prompt(64, 2, 60, seed=3)
    mask[1, 61:] = 1
    with torch.no_grad(), hybrid(m, [(0, 0), (1, 2)], sink=3, window=8, decode="stream") as h:
        cache = h.cache()
        out = m.model(input_ids=ids[:, :61], attention_mask=mask[:, :61], cache=cache, use_cache=True)
        armed.append(True)
        for t in range(61, 64):
            m.model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=out.past_key_values)
    assert h.stats["trimmed"] == 3 * m.num_layers


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} reads a tensor back to the host inside a decoding step")

    return refuse


def test_full_decoding_after_a_hybrid_prefill(tiny_dir):
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[2]))
    ids, mask = _prompt(61, 1, 0, seed=7)
    policy = [(0, 0), (1, 3)]
    steps = 6
    gen = {
        "max_new_tokens": steps,
        "do_sample": False,
        "output_scores": True,
        "return_dict_in_generate": True,
    }
    with torch.no_grad():
        with hybrid(m, policy, sink=3, window=8) as h:  # decode="full" is the default
            full = m.model.generate(input_ids=ids, attention_mask=mask, cache=h.cache(), **gen)
        with hybrid(m, policy, sink=3, window=8, decode="stream") as s:
            stream = m.model.generate(input_ids=ids, attention_mask=mask, cache=s.cache(), **gen)
        # The oracle: a hybrid prefill (dense reference kernel), then the stock model decodes from its cache.
        with hybrid(m, policy, sink=3, window=8, kernel="reference"):
            out = m.model(input_ids=ids, attention_mask=mask, use_cache=True)
        cache, scores = out.cache, [out.logits[:, -1]]
        for _ in range(steps - 1):
            at = torch.tensor([ids.shape[1] + len(scores) - 1])
            step = {
                "cache": cache,
                "cache_position": at,
                "position_ids": at.expand(3, 1, 1),
                "use_cache": True,
            }
            out = m.model(input_ids=scores[-1].argmax(-1)[:, None], **step)
            scores.append(out.logits[:, -1])
    want = torch.cat([ids, torch.stack([x.argmax(-1) for x in scores], dim=1)], dim=1)
    assert torch.equal(full.sequences, want)
    assert max((a - b).abs().max().item() for a, b in zip(full.scores, scores)) <= 1e-4
    # Streaming in decoding moves the logits of every step after the first (the prefill is shared).
    assert (stream.scores[0] - scores[0]).abs().max().item() <= 1e-4
    assert min((a - b).abs().max().item() for a, b in zip(stream.scores[1:], scores[1:])) > 1e-3
    assert h.stats["masked"] == h.stats["trimmed"] == 0 and h.cache_report()["saved_fraction"] == 0
    assert s.cache_report()["saved_fraction"] > 0
    with pytest.raises(CorelensError, match="decode mode"):
        hybrid(m, policy, decode="half").__enter__()


def test_pooled_ideal_speedup_counts_the_kept_pairs():
    from corelens.attention.kernels import pooled_speedup

    lengths, sink, window, fraction = [5, 12, 40], 2, 6, 0.25

    def kept(n):  # the streaming rule, pair by pair
        return sum(1 for i in range(n) for j in range(i + 1) if j < sink or i - j < window)

    dense = sum(n * (n + 1) // 2 for n in lengths)  # 15 + 78 + 820
    stream = sum(kept(n) for n in lengths)  # 15 + (36 + 4 * 8) + (36 + 32 * 8): rows past S + W keep 8
    assert (dense, stream) == (913, 375)
    want = dense / (fraction * dense + (1 - fraction) * stream)
    assert pooled_speedup(lengths, fraction, sink, window) == pytest.approx(want, rel=1e-12)
    at_mean = corelens.attention.kernels.ideal_speedup(19, fraction, sink, window)
    assert abs(pooled_speedup(lengths, fraction, sink, window) - at_mean) > 0.1


def test_trimmed_cache_refuses_to_leave_its_block(tiny_dir):
    m = corelens.load(tiny_dir("qwen2_5_vl"))
    ids, mask = _prompt(40, 1, 0)
    with hybrid(m, [(0, 0)], sink=2, window=4, decode="stream") as h:
        cache = h.cache()
        with torch.no_grad():
            m.model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    assert cache.layers[1].trimmed
    with pytest.raises(CorelensError, match="inside its"), torch.no_grad():
        m.model(input_ids=ids[:, :1], cache=cache, use_cache=True)
    with pytest.raises(CorelensError, match="cannot be cropped"):
        cache.crop(-1)


def test_policy_is_plain_data(tmp_path):
    heads = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [3, 1, 2, 4], "mass": [0.2, 0.4, 0.3, 0.1]}
    )
    top = HybridPlan.from_heads(heads, "50%", sink=8, window=64)
    assert top.full == ((0, 1), (1, 0))
    assert HybridPlan.from_heads(heads, 1, kind="bottom").full == ((1, 1),)
    assert len(HybridPlan.from_heads(heads, 0.5, kind="random", seed=2).full) == 2
    # Layer-matched full sets never hold a top head; the table says how many heads they lack.
    from corelens.experiments.hybrid import conditions

    conds = conditions(heads, ["50%", "75%"], ["layer-matched", "random"], 1, 0, 8, 64)
    got = {c.name: (c.policy.full, c.short_by) for c in conds[1:]}
    assert got["layer-matched/50%/s0"] == (((0, 0), (1, 1)), 0)  # top: (0, 1), (1, 0)
    assert got["layer-matched/75%/s0"] == (((1, 1),), 2)  # top adds (0, 0): layer 0 has no other head
    assert [len(got[f"random/{k}/s0"][0]) for k in ("50%", "75%")] == [2, 3]
    # The one file format is the registered policy's; the plan is what the kernels read of it.
    policy = HybridAttention.from_heads(heads, "50%", sink=8, window=64, decode="stream")
    assert policy == HybridAttention.of(top, decode="stream") and policy.plan() == top
    path = tmp_path / "p.json"
    path.write_text(policy.to_json())
    assert Policy.from_file(path) == policy and json.loads(path.read_text())["source"]["keep"] == "50%"
    csv = tmp_path / "heads.csv"
    heads.to_csv(csv, index=False)
    assert as_plan(csv, keep="50%").full == top.full
    assert as_plan(Policy.from_file(path).plan(), window=7).window == 7
    assert as_plan([(1, 1), (0, 0), (1, 1)]).full == ((0, 0), (1, 1))
    assert top.streaming_kv(2, 2, 1).tolist() == [[False], [False]]
    assert top.ideal_speedup(4096, 2, 2) == pytest.approx(
        corelens.attention.kernels.ideal_speedup(4096, 0.5, 8, 64)
    )
    with pytest.raises(CorelensError, match="outside a model"):
        HybridPlan(((2, 0),)).full_mask(2, 2)
    with pytest.raises(CorelensError, match="not a hybrid policy"):
        Policy.from_dict({"format": "x"})
    with pytest.raises(ValueError, match="needs `keep`"):
        as_plan(csv)


def _old_files(tmp_path) -> list[Path]:
    """Return the old hybrid policy file and an entry of an old policies.json, each as a file."""
    entry = tmp_path / "entry.json"
    entry.write_text(json.dumps(json.loads((OLD / "policies.json").read_text())[1]))
    return [OLD / "hybrid-policy.json", entry]


def test_an_old_hybrid_policy_file_is_the_policy_it_holds_in_every_reader(tmp_path):
    """`HybridPolicy.save` files and old policies.json entries, read by every reader of a policy file, convert
    (one function, one line of warning) to the equal policy, which answers as the old code did."""
    from corelens.integrations.kvpress import PolicyPress
    from corelens.integrations.lmms_eval.policy import load_policy
    from corelens.organism import organism_path
    from corelens.organism.tasks import generate

    core = ((0, 5), (0, 6), (0, 7), (1, 0))
    readers = {
        "Policy.from_file": Policy.from_file,
        "Policy.from_json": lambda path: Policy.from_json(path.read_text()),
        "HybridAttention.from_file": HybridAttention.from_file,
        "lmms-eval policy=": load_policy,
        "kvpress PolicyPress": lambda path: PolicyPress(path).policy,
    }
    read = {}
    for path in _old_files(tmp_path):
        for name, reader in readers.items():
            with pytest.warns(CorelensDeprecationWarning) as caught:
                read[path.name, name] = reader(path)
            (message,) = [str(w.message) for w in caught]
            assert "corelens.hybrid-policy/1 is deprecated" in message and "\n" not in message, message
    assert set(read.values()) == {HybridAttention(core, 4, 8)}
    assert all(p.source == {"keep": "4", "kind": "top"} and type(p) is HybridAttention for p in read.values())
    # The same answers as the old code gave from the old file (recorded before the change): greedy, 2 tokens.
    m = corelens.load(organism_path(), device="cpu")
    samples, _ = corelens.read_samples(generate("image", tmp_path / "data", 1, seed=1))
    inputs = corelens.prepare(m, samples[0]).inputs
    policy = read["hybrid-policy.json", "Policy.from_file"]
    got = {}
    for decode in ("full", "stream"):
        with torch.no_grad(), HybridAttention.of(policy.plan(), decode=decode).applied(m) as on:
            h = on.hooks[0].session
            out = m.model.generate(**inputs, max_new_tokens=2, do_sample=False, cache=h.cache())
            new = m.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
            got[decode] = (new, round(h.cache_report()["saved_fraction"], 2))
    assert got == {"full": ("green cross", 0.0), "stream": ("green <|im_end|>", 0.57)}


def test_the_old_name_hybrid_policy_warns_and_still_works(tmp_path):
    """`HybridPolicy`, from its path and the older `corelens.attention.hybrid`, is the plan, with a warning;
    its files (old format) still write and read, through the one conversion."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import corelens.attention.hybrid as older  # the module's own old path (a shim file)
    for module in (corelens.attention.streaming, older):
        with pytest.warns(CorelensDeprecationWarning, match="HybridPolicy is deprecated .*HybridAttention"):
            old = module.HybridPolicy
        assert issubclass(old, HybridPlan)
    plan = old(((1, 0), (0, 1)), 4, 8, {"keep": "2"})
    path = plan.save(tmp_path / "p.json")
    assert sorted(json.loads(path.read_text())) == sorted(
        json.loads((OLD / "hybrid-policy.json").read_text())
    )
    with pytest.warns(CorelensDeprecationWarning, match="hybrid-policy/1"):
        assert old.load(path) == plan
    with pytest.warns(CorelensDeprecationWarning, match="hybrid-policy/1"):
        assert Policy.from_file(path) == HybridAttention.of(plan)


def test_hybrid_command_writes_the_curve_and_resumes(tiny_dir, tmp_path):
    from corelens.cli import main
    from corelens.organism.tasks import generate

    model = tiny_dir("qwen2_5_vl")
    data = generate("document", tmp_path / "data", n=2, seed=7)  # 6 and 5 pages: two prompt lengths
    rows = [(layer, head, 8 - (4 * layer + head)) for layer in range(2) for head in range(4)]
    heads = tmp_path / "rank" / "heads.csv"
    heads.parent.mkdir()
    pd.DataFrame(rows, columns=["layer", "head", "rank"]).assign(mass=0.0).to_csv(heads, index=False)
    out = tmp_path / "run"
    argv = ["hybrid", "--model", str(model), "--data", str(data), "--heads", str(heads), "--out", str(out),
            "--keep", "25%", "--seeds", "2", "--sink", "2", "--window", "10%", "--max-new-tokens", "2",
            "--decode", "stream"]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_csv(out / "hybrid.csv")
    assert list(table["set"]) == ["dense", "top", "random", "random", "bottom"]
    assert list(table["full_heads"]) == [8, 2, 2, 2, 2] and (table["n"] == 2).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sink_tokens"] == 2 and manifest["window_tokens"] == round(
        0.1 * manifest["median_prompt_tokens"]
    )
    assert (table.loc[table["set"] != "dense", "cache_saved_fraction"] > 0).all()
    # The ideal speed-up pools the pairs of every prompt: count them here, pair by pair.
    tokens = pd.read_parquet(out / "records.parquet").drop_duplicates("sample")["tokens"].tolist()
    sink, window = 2, manifest["window_tokens"]
    # Each condition is recorded as its registered policy (the one hybrid policy file): reproducible from the run.
    entries = {e["name"]: e for e in json.loads((out / "policies.json").read_text())}
    top = HybridAttention(((1, 2), (1, 3)), sink, window, decode="stream")
    assert Policy.from_dict(entries["top/25%"]["policy"]) == top and "policy" not in entries["dense"]
    dense = sum(n * (n + 1) // 2 for n in tokens)
    stream = sum(1 for n in tokens for i in range(n) for j in range(i + 1) if j < sink or i - j < window)
    speedup = dense / (0.25 * dense + 0.75 * stream)
    assert table["ideal_speedup"].iloc[1:].tolist() == pytest.approx([speedup] * 4, rel=1e-12)
    assert table["ideal_speedup"].iloc[0] == pytest.approx(1.0)
    assert (out / "figures" / "hybrid.png").stat().st_size > 0
    logged = (out / "samples.jsonl").read_text()
    assert main(argv) == 0  # resumed: nothing is answered twice
    assert (out / "samples.jsonl").read_text() == logged


def _one_document_study(tiny_dir, tmp_path):
    """A tiny model, one organism document and a heads.csv ranking its 2 x 4 heads in reverse order."""
    from corelens.organism.tasks import generate

    model = tiny_dir("qwen2_5_vl")
    data = generate("document", tmp_path / "data", n=1, seed=7)
    rows = [(layer, head, 8 - (4 * layer + head)) for layer in range(2) for head in range(4)]
    heads = tmp_path / "rank" / "heads.csv"
    heads.parent.mkdir()
    pd.DataFrame(rows, columns=["layer", "head", "rank"]).assign(mass=0.0).to_csv(heads, index=False)
    return model, data, heads


def test_crossover_runs_dense_and_says_so_in_table_and_manifest(tiny_dir, tmp_path, capsys):
    """`--kernel partitioned`: below the crossover every head runs dense, counted in hybrid.csv and the manifest."""
    from corelens.cli import main

    model, data, heads = _one_document_study(tiny_dir, tmp_path)
    base = ["hybrid", "--model", str(model), "--data", str(data), "--heads", str(heads), "--keep", "25%",
            "--sets", "top", "--sink", "2", "--window", "4", "--max-new-tokens", "2", "--kernel", "partitioned"]  # fmt: skip
    got = {}
    for below in ("100", "0"):  # an ideal speed-up below 100: always dense; 0: never
        out = tmp_path / f"below-{below}"
        capsys.readouterr()
        assert main([*base, "--dense-below", below, "--out", str(out)]) == 0
        err = capsys.readouterr().err
        table = pd.read_csv(out / "hybrid.csv").set_index("set")
        prefill = json.loads((out / "manifest.json").read_text())["prefill"]
        assert prefill["kernel"] == "partitioned" and prefill["dense_below"] == float(below)
        assert prefill["crossover"] == ["ideal"] and prefill["fallbacks"] == []  # no table set, no fallback
        got[below] = (table, prefill["layer_prefills"], err)
    table, layers, err = got["100"]
    assert table.loc["top", "dense_prefills"] == 1 and set(layers) == {"dense"} and layers["dense"] >= 2
    assert "ran every head dense" in err
    assert table.loc["top", "correct"] == table.loc["dense", "correct"]  # dense is the stock model
    table, layers, err = got["0"]
    assert table.loc["top", "dense_prefills"] == 0 and set(layers) == {"partitioned"}
    assert "ran every head dense" not in err


def _recorded_decoding(m, policy, ids, mask, prompt, monkeypatch):
    """Run `_forced_decoding` with every decoding step's `decode_attention` calls recorded (key length,
    whether it had a mask) and layer 0's buffer (pointer, capacity) after each step; no step reads a tensor
    back to the host."""
    from corelens.attention import streaming as hybrid_module
    from corelens.attention.kernels import cache as cache_module
    from corelens.attention.streaming import HybridHook

    calls, buffers = [], []
    attend = hybrid_module.decode_attention

    def recorded(query, key, value, allowed, scale):
        calls.append((key.shape[2], allowed is not None))
        return attend(query, key, value, allowed, scale)

    def guarded(fn):
        def run(self, *args, **kwargs):
            with pytest.MonkeyPatch.context() as patch:
                for name in _HOST_READS:
                    patch.setattr(torch.Tensor, name, _refuse(name))
                out = fn(self, *args, **kwargs)
            if isinstance(self, cache_module.HybridCacheLayer) and self.index == 0:
                buffers.append((self.keys.data_ptr(), self.capacity))
            return out

        return run

    monkeypatch.setattr(hybrid_module, "decode_attention", recorded)
    monkeypatch.setattr(
        cache_module.HybridCacheLayer,
        "_update_trimmed",
        guarded(cache_module.HybridCacheLayer._update_trimmed),
    )
    monkeypatch.setattr(HybridHook, "_trimmed", guarded(HybridHook._trimmed))
    logits, h = _forced_decoding(m, policy, ids, mask, prompt)
    return logits, h, calls, buffers


def test_trimmed_decoding_attends_over_live_positions_in_a_chunked_buffer(tiny_dir, monkeypatch):
    """The full KV heads live in a preallocated buffer grown by whole chunks, written in place between; each
    step's full-head call reads the live positions only (one more per step), and every step's logits equal the
    dense reference's."""
    from corelens.attention.kernels import cache as cache_module

    monkeypatch.setattr(cache_module, "CHUNK", 4)  # prompt 61 -> room for 65 positions, then 69
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[2]))
    ids, mask = _prompt(67, 2, 9, seed=5)
    policy = [(0, 0), (1, 2)]  # layer 0: KV head 0 mixed (kept), KV head 1 streams; layer 1 likewise
    dense, _ = _forced_decoding(m, policy, ids, mask, 61, kernel="reference")
    trimmed, h, calls, buffers = _recorded_decoding(m, policy, ids, mask, 61, monkeypatch)
    assert h.stats["trimmed"] == 6 * m.num_layers
    assert (trimmed - dense).abs().max().item() <= 1e-5  # the prefill's logits and each step's
    per_step = len(calls) // 6
    full_keys = [calls[i * per_step][0] for i in range(6)]  # layer 0's full-head call comes first
    assert full_keys == [62, 63, 64, 65, 66, 67]  # the live positions, never the buffer's tail
    assert all(masked for _, masked in calls)  # padded rows and a mixed KV head: the mask stays
    assert [c for _, c in buffers] == [65, 65, 65, 65, 69, 69]  # one chunk more when full
    assert len({p for p, _ in buffers[:4]}) == len({p for p, _ in buffers[4:]}) == 1  # written in place
    assert h.cache_report()["reserved_bytes"] > 0


def test_a_window_that_covers_the_prompts_is_said_in_terminal_table_and_manifest(tiny_dir, tmp_path, capsys):
    """At the defaults (S = 128, W = 1024) a short prompt is seen whole by every streaming head: hybrid
    attention changes nothing, and the run says so with settings that would act; S + W that act say nothing."""
    from corelens.cli import main

    model, data, heads = _one_document_study(tiny_dir, tmp_path)
    base = ["hybrid", "--model", str(model), "--data", str(data), "--heads", str(heads), "--n-heads", "25%",
            "--sets", "top", "--max-new-tokens", "1"]  # fmt: skip
    said = {}
    for name, sizes in (("defaults", []), ("acting", ["--sink", "2", "--window", "4"])):
        out = tmp_path / name
        capsys.readouterr()
        assert main([*base, *sizes, "--out", str(out)]) == 0
        printed = capsys.readouterr()
        table = pd.read_csv(out / "hybrid.csv").set_index("set")
        manifest = json.loads((out / "manifest.json").read_text())
        said[name] = (printed.err, printed.out, table.loc["top", "prompt_covered"], manifest["no_effect"])
    err, out, covered, noted = said["defaults"]
    assert "S + W = 128 + 1024 tokens cover the whole prompt of 1 of 1 samples" in err
    assert "--sink 2% --window 10%" in err and noted in err and "prompt_covered" in out
    assert covered == 1.0
    err, out, covered, noted = said["acting"]
    assert "cover the whole prompt" not in err and noted is None and covered == 0.0


def test_unpadded_decoding_of_whole_full_kv_heads_runs_without_a_mask(tiny_dir, monkeypatch):
    """A one-token step of an unpadded prompt whose kept KV heads hold only full query heads calls sdpa with no
    mask over the live keys (so flash / cuDNN split them, as for stock decoding); equal to the dense rule."""
    m = corelens.load(tiny_dir("qwen2_5_vl", **GROUPS[2]))
    ids, mask = _prompt(66, 1, 0, seed=8)
    policy = [(0, 0), (0, 1), (1, 2), (1, 3)]  # KV-granular: KV head 0 of layer 0, KV head 1 of layer 1
    dense, _ = _forced_decoding(m, policy, ids, mask, 61, kernel="reference")
    trimmed, h, calls, _ = _recorded_decoding(m, policy, ids, mask, 61, monkeypatch)
    assert (trimmed - dense).abs().max().item() <= 1e-5
    full_calls = [c for c in calls if c[0] > 3 + 8]  # the streaming calls read S + W = 11 slots
    assert full_calls and not any(masked for _, masked in full_calls)
    assert [n for n, _ in full_calls[:: m.num_layers]] == [62, 63, 64, 65, 66]
