"""Real-scale code paths on the CPU: hub ids from a hub cache, bf16, device maps with offloaded layers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers import hybrid
from transformers import AttentionInterface, AutoModelForImageTextToText
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import corelens
from corelens.cli import main
from corelens.data import read_samples
from corelens.errors import CorelensError
from corelens.experiments.evaluate import answer
from corelens.models.loaded import resolve_device
from corelens.models.prepare import prepare
from corelens.organism.tasks import WORDS, generate
from corelens.policies import POLICIES, ZeroHeads

COMMIT = "0123456789abcdef0123456789abcdef01234567"
# Decoder layer 1 lives on disk and is loaded by accelerate's hooks at each forward; the rest stays on the CPU.
OFFLOAD = {
    "model.visual": "cpu",
    "model.language_model.embed_tokens": "cpu",
    "model.language_model.layers.0": "cpu",
    "model.language_model.layers.1": "disk",
    "model.language_model.norm": "cpu",
    "model.language_model.rotary_emb": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("scale")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "data", 3, seed=3)
    samples, _ = read_samples(data)
    return {"model": model, "data": data, "samples": samples, "root": root}


def _hub_cache(home, model_dir, repo="corelens-test/tiny-qwen"):
    """Lay `model_dir` out as huggingface_hub's cache does: refs/main -> snapshots/<commit>/."""
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    shutil.copytree(model_dir, folder / "snapshots" / COMMIT)
    return folder / "snapshots" / COMMIT


def test_hub_id_loads_offline_from_the_cache(tiny, tmp_path, monkeypatch):
    snapshot = _hub_cache(tmp_path / "hf", tiny["model"])
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for spec, revision in [("corelens-test/tiny-qwen", None), (f"corelens-test/tiny-qwen@{COMMIT}", None),
                           ("corelens-test/tiny-qwen", "main")]:  # fmt: skip
        m = corelens.load(spec, revision=revision, device="cpu")
        assert (
            m.path == snapshot
            and m.source["commit"] == COMMIT
            and m.source["id"] == "corelens-test/tiny-qwen"
        )
    out = tmp_path / "run"
    assert main(["rank", "--model", "corelens-test/tiny-qwen", "--data", str(tiny["data"]), "--out", str(out),
                 "--overlays", "0"]) == 0  # fmt: skip
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["model_id"] == "corelens-test/tiny-qwen" and settings["model_commit"] == COMMIT
    assert settings["model"] == str(snapshot.resolve()) and settings["dtype"] == "float32"


def test_missing_hub_id_is_one_clear_line(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(
        ["rank", "--model", "nobody/absent@v2", "--data", str(tiny["data"]), "--out", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert (
        "nobody/absent@v2" in err[0]
        and str(tmp_path / "empty" / "hub") in err[0]
        and "HF_HUB_OFFLINE is set, so nothing is downloaded" in err[0]
    )
    with pytest.raises(CorelensError, match="not a hub id"):
        corelens.load(str(tmp_path / "no-such-folder"))
    (tmp_path / "empty-folder").mkdir()
    with pytest.raises(CorelensError, match="no config.json"):
        corelens.load(tmp_path / "empty-folder")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cuda:0"], "no CUDA device"),
        (["--device", "tpu9"], "expected auto, cpu, cuda or cuda:N"),
        (["--device-map", "nowhere.json"], "expected auto, balanced"),
        (["--device-map", "auto", "--max-memory", "0:70GiB"], "DEVICE=AMOUNT"),
    ],
)
def test_bad_placement_options_are_clean_errors(tiny, tmp_path, capsys, args, message):
    if "cuda" in args[1] and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = main(
        ["rank", "--model", str(tiny["model"]), "--data", str(tiny["data"]), "--out", str(tmp_path), *args]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_device_and_dtype_resolution():
    assert resolve_device("auto") == torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    assert corelens.models.loaded.resolve_dtype("auto", None, torch.device("cpu")) == torch.float32


# ---------------------------------------------------------------- bf16


def _stock(path, dtype, attn="sdpa"):
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    return model.eval()


def test_bf16_logits_are_the_stock_models(tiny):
    m = corelens.load(tiny["model"], dtype="bfloat16", device="cpu")
    assert m.dtype == torch.bfloat16
    stock = _stock(tiny["model"], torch.bfloat16)
    for sample in tiny["samples"]:
        inputs = prepare(m, sample).inputs
        with torch.no_grad():
            ours, ref = m.model(**inputs).logits, stock(**inputs).logits
        assert ours.dtype == torch.bfloat16 and torch.equal(ours, ref)


def test_bf16_ram_equals_fp32_weights_of_the_same_bf16_queries_and_keys(tiny):
    captured: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}

    def capture(module, query, key, value, attention_mask, scaling=None, **kwargs):
        captured[module.layer_idx] = (query.detach().clone(), key.detach().clone(), scaling)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    AttentionInterface.register("capture_test", capture)
    AttentionMaskInterface.register("capture_test", sdpa_mask)
    stock = _stock(
        tiny["model"], torch.bfloat16, {"": "sdpa", "text_config": "capture_test", "vision_config": "sdpa"}
    )
    m = corelens.load(tiny["model"], dtype="bfloat16", device="cpu")
    for sample in tiny["samples"]:
        result = corelens.measure_sample(m, sample)
        prepared = prepare(m, sample)
        rows, omega, visual = (
            prepared.rows("question"),
            prepared.layout.omega(sample.targets),
            prepared.layout.visual,
        )
        with torch.no_grad():
            stock(**prepared.inputs)
        for layer, (q, k, scale) in captured.items():
            assert q.dtype == torch.bfloat16
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # GQA
            scores = (q[0, :, rows].double() @ k[0].double().transpose(-1, -2)) * scale
            causal = torch.arange(k.shape[2])[None, :] > torch.as_tensor(rows)[:, None]
            probs = scores.masked_fill(causal, float("-inf")).softmax(-1)
            mass = probs[:, :, omega].sum(-1).mean(-1).numpy()
            share = mass / probs[:, :, visual].sum(-1).mean(-1).numpy()
            np.testing.assert_allclose(result.mass[layer], mass, atol=1e-5, rtol=0)
            np.testing.assert_allclose(result.share[layer], share, atol=1e-5, rtol=1e-5)


def _o_proj_zeroed(m, heads):
    d = m.text_config.head_dim
    handles = []
    for layer in sorted({lh[0] for lh in heads}):
        mine = [h for lh_layer, h in heads if lh_layer == layer]

        def hook(module, args, mine=mine):
            x = args[0].clone()
            for h in mine:
                x[..., h * d : (h + 1) * d] = 0
            return (x,)

        handles.append(m.attention_layers[layer].o_proj.register_forward_pre_hook(hook))
    return handles


def test_bf16_ablation_and_hybrid_equal_their_dense_references(tiny):
    m = corelens.load(tiny["model"], dtype="bfloat16", device="cpu")
    heads = [(0, 1), (1, 0), (1, 3)]
    for sample in tiny["samples"]:
        inputs = prepare(m, sample).inputs
        with torch.no_grad():
            plain = m.model(**inputs).logits.float()
            with ZeroHeads(heads).applied(m):
                ours = m.model(**inputs).logits.float()
            handles = _o_proj_zeroed(m, heads)
            try:
                ref = m.model(**inputs).logits.float()
            finally:
                for h in handles:
                    h.remove()
            # Zeroing the same slice of the same bf16 tensor: identical, not merely close.
            assert torch.equal(ours, ref) and (ours - plain).abs().max() > 1e-2
            outs = {}
            for kernel in ("reference", "auto"):
                with hybrid(m, heads, sink=3, window=7, kernel=kernel):
                    outs[kernel] = m.model(**inputs).logits.float()
        # bf16 tolerance: both kernels compute fp32 softmax rows over the same bf16 q/k/v and round the
        # output to bf16 once (one bf16 ulp at |x| <= 2 is 2^-7); the logits differ by at most 2e-2.
        assert (outs["auto"] - outs["reference"]).abs().max().item() <= 2e-2
        assert (outs["reference"] - plain).abs().max().item() > 2e-2  # the pattern bites


# ---------------------------------------------------------------- device maps


def test_offloaded_layers_give_the_unmapped_results(tiny, tmp_path):
    plain = corelens.load(tiny["model"], device="cpu")
    mapped = corelens.load(tiny["model"], device_map=OFFLOAD, offload_folder=tmp_path / "offload")
    layer1 = mapped.attention_layers[1]
    assert layer1.q_proj.weight.device.type == "meta"  # really offloaded: accelerate loads it per forward
    assert hasattr(mapped.model.model.language_model.layers[1], "_hf_hook") and mapped.device.type == "cpu"
    heads = [(0, 1), (1, 0), (1, 3)]
    for sample in tiny["samples"]:
        a, b = corelens.measure_sample(plain, sample), corelens.measure_sample(mapped, sample)
        np.testing.assert_array_equal(a.mass, b.mass)
        for op in ("zero", "uniform", "knockout"):
            got = []
            for m in (plain, mapped):
                with POLICIES[op](tuple(heads)).applied(m, prepare(m, sample), sample=sample):
                    got.append(answer(m, sample, max_new_tokens=4))
            assert got[0] == got[1]
        inputs = prepare(plain, sample).inputs
        logits = []
        for m in (plain, mapped):
            with torch.no_grad(), hybrid(m, heads, sink=3, window=7, decode="stream") as h:
                logits.append(m.model(**inputs).logits)
                out = m.model.generate(**inputs, cache=h.cache(), max_new_tokens=4, do_sample=False)
            logits.append(out)
        assert torch.equal(logits[0], logits[2]) and torch.equal(logits[1], logits[3])


def test_noise_qkv_refuses_offloaded_weights(tiny, tmp_path):
    from corelens.experiments.flow import flow

    mapped = corelens.load(tiny["model"], device_map=OFFLOAD, offload_folder=tmp_path / "offload")
    with pytest.raises(CorelensError, match="offloaded"):
        flow(mapped, tiny["data"], baselines=("noise-qkv",))


def test_rank_in_bf16_from_the_command_line(tiny, tmp_path):
    out = tmp_path / "bf16"
    assert main(["rank", "--model", str(tiny["model"]), "--data", str(tiny["data"]), "--out", str(out),
                 "--dtype", "bfloat16", "--device", "cpu", "--overlays", "0"]) == 0  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["dtype"] == "bfloat16"
    fp32 = tmp_path / "fp32"
    assert main(["rank", "--model", str(tiny["model"]), "--data", str(tiny["data"]), "--out", str(fp32),
                 "--overlays", "0"]) == 0  # fmt: skip
    import pandas as pd

    a, b = pd.read_csv(out / "heads.csv"), pd.read_csv(fp32 / "heads.csv")
    assert (
        np.abs(
            a.sort_values(["layer", "head"])["mass"].values - b.sort_values(["layer", "head"])["mass"].values
        ).max()
        < 0.02
    )
    # A bf16 run does not resume an fp32 one.
    assert main(["rank", "--model", str(tiny["model"]), "--data", str(tiny["data"]), "--out", str(out),
                 "--overlays", "0"]) == 2  # fmt: skip
