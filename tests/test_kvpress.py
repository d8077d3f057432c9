"""kvpress with a corelens head set: cache kept per KV head, generation, all-full = the uncompressed model."""

from __future__ import annotations

import pytest
import torch
from helpers import register_toy_policy
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import corelens
from corelens.attention import NAME
from corelens.data import read_samples
from corelens.errors import CorelensError
from corelens.heads import HeadSet
from corelens.models.prepare import prepare
from corelens.organism.tasks import WORDS, generate

pytest.importorskip("kvpress", reason="the kvpress extra is not installed")
from corelens.integrations.kvpress import CorePress  # noqa: E402

SINK, WINDOW = 3, 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny GQA checkpoint (3 layers x 4 heads over 2 KV heads), an image prompt, a head set on it."""
    import pandas as pd

    from corelens.heads.artifact import model_info
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("kvpress")
    path = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=3, heads=4, kv_heads=2)
    m = corelens.load(path, device="cpu")
    samples, _ = read_samples(generate("image", root / "data", 1, seed=2))
    prepared = prepare(m, samples[0])
    inputs = prepared.inputs
    # Ranked so the top 2 heads are L0H1 (KV head 0) and L2H3 (KV head 1).
    order = [(0, 1), (2, 3)] + [
        (lyr, hd) for lyr in range(3) for hd in range(4) if (lyr, hd) not in ((0, 1), (2, 3))
    ]
    table = pd.DataFrame([{"layer": lyr, "head": hd, "rank": i + 1} for i, (lyr, hd) in enumerate(order)])
    hs = HeadSet(model_info(m.model.config, m.source), table, keep=2)
    hs.save(root / "headset")
    return {"m": m, "inputs": inputs, "headset": hs, "folder": root / "headset", "prepared": prepared}


def _generate(m, inputs, press=None, new=6):
    with torch.no_grad():
        if press is None:
            return m.model.generate(**inputs, max_new_tokens=new, do_sample=False)
        with press(m.model):
            return m.model.generate(**inputs, max_new_tokens=new, do_sample=False)


def test_cache_kept_per_head_and_generation(setup):
    m, inputs = setup["m"], setup["inputs"]
    n = inputs["input_ids"].shape[1]
    press = CorePress(heads=setup["folder"], sink=SINK, window=WINDOW)
    out = _generate(m, inputs, press)
    assert out.shape[1] == n + 6  # generation ran to the end
    kept = press.kept(m.model)
    expected = torch.full((3, 2), SINK + WINDOW)
    expected[0, 0] = expected[2, 1] = n  # the CoRe KV heads keep the whole prompt
    assert torch.equal(kept, expected), (kept, n)
    masked = m.attention_layers[1].masked_key_indices
    assert sorted(set(masked[2].tolist())) == list(range(SINK, n - WINDOW))  # exactly between sink and window
    assert press.compression_ratio == pytest.approx(4 / 6 * (1 - (SINK + WINDOW) / n))
    # The press bites: streaming heads see fewer keys, and the answer's logits move. This holds too when the
    # corelens attention function was registered after kvpress's import wrapped the others (dropped here).
    ALL_ATTENTION_FUNCTIONS._local_mapping.pop(NAME, None)
    with torch.no_grad(), press(m.model):
        pressed = m.model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True).logits  # fmt: skip
    plain = m.model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                             return_dict_in_generate=True).logits  # fmt: skip
    assert torch.allclose(pressed[0], plain[0], atol=1e-5)  # the prefill is full attention in kvpress
    assert (pressed[1] - plain[1]).abs().max() > 1e-4


def test_all_heads_full_is_the_uncompressed_model(setup):
    m, inputs = setup["m"], setup["inputs"]
    n = inputs["input_ids"].shape[1]
    press = CorePress(heads=setup["headset"], keep="100%", sink=SINK, window=WINDOW)
    assert torch.equal(_generate(m, inputs, press), _generate(m, inputs))
    assert torch.equal(press.kept(m.model), torch.full((3, 2), n))


def test_a_press_for_another_shape_is_refused(setup, tmp_path):
    from corelens.models.tiny import build_tiny_checkpoint

    other = corelens.load(
        build_tiny_checkpoint("qwen2_5_vl", tmp_path, words=WORDS, layers=2, heads=4, kv_heads=2)
    )
    with pytest.raises(CorelensError, match="layers 3 -> 2"), CorePress(heads=setup["folder"])(other.model):
        pass


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"head_compression_ratio": 0.3}, "head_compression_ratio=0.3"),
        ({"on_the_fly_scoring": True}, "on_the_fly_scoring=True"),
    ],
)
def test_arguments_the_press_would_overwrite_are_refused(setup, given, named):
    """DuoAttentionPress arguments CorePress sets from the head set (or that would ignore it): one clear line."""
    with pytest.raises(CorelensError) as err:
        CorePress(heads=setup["folder"], **given)
    assert str(err.value).startswith(f"CorePress: {named} is not taken") and "\n" not in str(err.value)
    CorePress(heads=setup["folder"], head_compression_ratio=0.0)  # the default is no overwrite


def test_any_registered_policy_is_a_press(setup, tmp_path):
    """`PolicyPress` takes a policy by name and fields, as JSON text or a JSON file: the same hooks as applying it."""
    from corelens.integrations.kvpress import PolicyPress
    from corelens.policies import ZeroHeads

    m, inputs = setup["m"], setup["inputs"]
    policy = ZeroHeads([(0, 1), (2, 3)])
    (tmp_path / "zero.json").write_text(policy.to_json())

    def logits(press=None):
        with torch.no_grad():
            if press is None:
                return m.model(**inputs).logits
            with press(m.model):  # the bare transformers model, as kvpress takes it
                return m.model(**inputs).logits

    with torch.no_grad(), policy.applied(m):
        want = m.model(**inputs).logits
    assert not torch.equal(want, logits())  # the heads change the output
    for press in (PolicyPress("zero", heads=[[0, 1], [2, 3]]), PolicyPress(policy.to_json()),
                  PolicyPress(str(tmp_path / "zero.json")), PolicyPress(policy)):  # fmt: skip
        assert press.policy == policy
        assert torch.equal(logits(press), want)
    with pytest.raises(CorelensError, match="unknown policy"):
        PolicyPress("erase")


def test_a_policy_the_press_never_names_is_a_press(setup, monkeypatch):
    """Policies `PolicyPress` has no line for: `uniform`, `knockout` (which reads the prompt's positions) and
    one registered in this test, each by name and fields and as JSON, equal to applying the policy."""
    from corelens.integrations.kvpress import PolicyPress
    from corelens.policies import Policy, UniformHeads

    toy = register_toy_policy(monkeypatch)  # zero ablation under a name no integration knows
    m, p = setup["m"], setup["prepared"]
    heads = [[0, 1], [1, 2], [2, 3]]

    def logits(applied):
        with torch.no_grad(), applied:
            return m.model(**p.inputs).logits

    with torch.no_grad():
        plain = m.model(**p.inputs).logits
    for name, fields in (("uniform", {}), ("knockout", {"keys": "visual"}), (toy, {})):
        policy = Policy.from_dict({"name": name, "heads": heads, **fields})
        want = logits(policy.applied(m, p))
        assert not torch.equal(want, plain), name  # the policy changes the output
        for press in (
            PolicyPress(name, heads=heads, prepared=p, **fields),
            PolicyPress(policy.to_json(), prepared=p),
        ):
            assert press.policy == policy
            assert torch.equal(logits(press(m.model)), want), name
    assert isinstance(PolicyPress("uniform", heads=heads).policy, UniformHeads)


@pytest.mark.parametrize("stock", ["StreamingLLMPress", "KnormPress"])
def test_a_stock_press_runs_once_made_compatible(setup, stock):
    """A stock kvpress press fails under the pinned transformers (the cache is passed as `cache`); `compatible`
    makes it run, and it prunes the prompt's cache as kvpress says (half of it at compression_ratio=0.5)."""
    import kvpress

    from corelens.integrations.kvpress import compatible

    m, inputs = setup["m"], setup["inputs"]
    n = inputs["input_ids"].shape[1]
    press = getattr(kvpress, stock)(compression_ratio=0.5)
    with pytest.raises(KeyError, match="past_key_values"), press(m.model), torch.no_grad():
        m.model.generate(**inputs, max_new_tokens=2, do_sample=False)
    with compatible(press)(m.model), torch.no_grad():
        out = m.model.generate(**inputs, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    kept = out.past_key_values.get_seq_length(0)
    assert kept == int(n * (1 - 0.5)) + 2  # the pruned prompt, then the two decoded tokens the cache holds


def test_a_stock_press_composes_with_corepress(setup):
    """`ComposedPress([KnormPress, CorePress])` made compatible: Knorm prunes the prompt's cache, then CorePress
    streams its heads over what is left (a pruning press goes first: CorePress masks positions of the cache
    it sees)."""
    from kvpress import ComposedPress, KnormPress

    from corelens.integrations.kvpress import compatible

    m, inputs = setup["m"], setup["inputs"]
    n = inputs["input_ids"].shape[1]
    core = CorePress(heads=setup["folder"], sink=SINK, window=WINDOW)
    composed = compatible(ComposedPress([KnormPress(compression_ratio=0.25), core]))
    with composed(m.model), torch.no_grad():
        out = m.model.generate(**inputs, max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    pruned = int(n * (1 - 0.25))
    assert out.past_key_values.get_seq_length(0) == pruned + 1
    expected = torch.full((3, 2), SINK + WINDOW)
    expected[0, 0] = expected[2, 1] = pruned  # the CoRe KV heads keep all Knorm kept
    assert torch.equal(core.kept(m.model), expected)


def test_a_policy_on_a_model_off_corelens_attention_switches_it(setup, caplog):
    """`PolicyPress` or `policy.applied` on a model the user loaded with sdpa: switched (with the note), so the
    policy acts; without the switch it would silently change nothing."""
    from transformers import AutoModelForImageTextToText

    from corelens.integrations.kvpress import PolicyPress
    from corelens.models.loaded import text_attention
    from corelens.policies import ZeroHeads

    m, inputs = setup["m"], setup["inputs"]
    bare = AutoModelForImageTextToText.from_pretrained(m.path, attn_implementation="sdpa").eval()
    policy = ZeroHeads([(layer, head) for layer in range(3) for head in range(4)])
    with torch.no_grad():
        plain = bare(**inputs).logits
        with policy.applied(m):
            want = m.model(**inputs).logits
        with caplog.at_level("WARNING"), PolicyPress(policy)(bare):
            got = bare(**inputs).logits
    assert text_attention(bare) == NAME and "switched from 'sdpa'" in caplog.text
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(got, plain, atol=1e-3)


def test_corepress_refuses_a_model_of_another_identity(setup, tmp_path):
    """Same shape, another rope_theta: refused as the CLI refuses it (HeadSet.check), naming what differs."""
    import json
    import shutil

    from transformers import AutoModelForImageTextToText

    from corelens.heads.artifact import model_info

    m = setup["m"]
    other = tmp_path / "other"
    shutil.copytree(m.path, other)
    config = json.loads((other / "config.json").read_text())
    config["text_config"]["rope_parameters"]["rope_theta"] = 12345.0
    (other / "config.json").write_text(json.dumps(config))
    hs = HeadSet(model_info(m.identity()), setup["headset"].heads, keep=2)
    model = AutoModelForImageTextToText.from_pretrained(other)
    with (
        pytest.raises(CorelensError, match="rope_theta"),
        CorePress(heads=hs, sink=SINK, window=WINDOW)(model),
    ):
        pass
