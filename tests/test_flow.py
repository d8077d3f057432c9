"""Residual capture, ε_RoPE, noise baselines and `corelens flow` (docs/methods.md#geometry) on tiny Qwen-VL checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

import corelens
from corelens.capture import ResidualCapture, decoder_layers
from corelens.cli import main
from corelens.experiments.flow import FlowOptions, flow, measure_flow, noise_delta, noised_qkv
from corelens.models.prepare import prepare
from corelens.organism.tasks import generate


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return generate("image", tmp_path_factory.mktemp("flow-data"), 2, seed=5)


def _inputs(m, data):
    sample = corelens.read_samples(data)[0][0]
    return sample, prepare(m, sample)


def _witnesses(m):
    """Independent views of the residual stream: each layer's input-norm input and post-attention-norm input."""
    seen: dict = {"in": {}, "mid": {}}
    handles = []
    for i, layer in enumerate(decoder_layers(m)):
        handles.append(
            layer.input_layernorm.register_forward_pre_hook(
                lambda mod, a, i=i: seen["in"].__setitem__(i, a[0][0])
            )
        )
        handles.append(
            layer.post_attention_layernorm.register_forward_pre_hook(
                lambda mod, a, i=i: seen["mid"].__setitem__(i, a[0][0])
            )
        )
    return seen, handles


def test_capture_matches_the_layers(tiny_dir, any_family, data):
    m = corelens.load(tiny_dir(any_family))
    _, p = _inputs(m, data)
    seen, handles = _witnesses(m)
    got = []
    positions = torch.tensor([0, 3, 5, p.seq_len - 1])
    try:
        with torch.no_grad(), ResidualCapture(m, got.append):
            out = m.model(**p.inputs, output_hidden_states=True, use_cache=False)
        with torch.no_grad(), ResidualCapture(m, got.append, positions=positions):
            m.model(**p.inputs, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    full, part = got[: m.num_layers], got[m.num_layers :]
    assert [s.layer for s in full] == list(range(m.num_layers))  # streamed in order, one layer at a time
    for s in full:
        assert s.x_in.dtype == torch.float32 and s.x_in.shape == (p.seq_len, m.text_config.hidden_size)
        assert torch.equal(s.x_in, seen["in"][s.layer].float())
        assert torch.equal(s.x_mid, seen["mid"][s.layer].float())
        if s.layer + 1 < m.num_layers:  # hidden_states[l + 1] is layer l's output (before any deepstack add)
            assert torch.equal(s.x_out, out.hidden_states[s.layer + 1][0].float())
        a_in, a_out = s.module("attn")
        f_in, f_out = s.module("ffn")
        assert a_out is f_in and s.module("ffn", "layer")[0] is a_in
    for s, whole in zip(part, full):
        assert torch.equal(s.x_mid, whole.x_mid[positions])


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])  # q_proj / k_proj, and q_norm / k_norm
def test_norope_equals_identity_rotation(tiny_dir, family, data):
    m = corelens.load(tiny_dir(family))
    _, p = _inputs(m, data)
    got, plain = [], []
    with torch.no_grad(), ResidualCapture(m, got.append, norope=True):
        m.model(**p.inputs, use_cache=False)
    rotary = m.model.model.language_model.rotary_emb
    handle = rotary.register_forward_hook(
        lambda mod, a, out: (torch.ones_like(out[0]), torch.zeros_like(out[1]))
    )
    try:
        with torch.no_grad(), ResidualCapture(m, plain.append):
            m.model(**p.inputs, use_cache=False)
    finally:
        handle.remove()
    # Layer 0 sees the same input in both runs: its rotation-free output is the no-RoPE model's.
    torch.testing.assert_close(got[0].delta_norope, plain[0].delta, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[0].x_mid_norope, plain[0].x_mid, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[0].delta, plain[0].delta, atol=1e-4)  # RoPE does change the output
    torch.testing.assert_close(got[0].delta, got[0].x_mid - got[0].x_in, rtol=1e-5, atol=1e-5)


def test_noise_baselines_and_weight_restore(tiny_dir, data):
    m = corelens.load(tiny_dir("qwen2_vl"))
    _, p = _inputs(m, data)
    real, noisy = [], []
    with torch.no_grad(), ResidualCapture(m, real.append):
        m.model(**p.inputs, use_cache=False)
    with torch.no_grad(), ResidualCapture(m, noisy.append, attn_delta=noise_delta(7)):
        m.model(**p.inputs, use_cache=False)
    assert torch.equal(real[0].x_in, noisy[0].x_in)
    d_real, d_noise = real[0].x_mid - real[0].x_in, noisy[0].x_mid - noisy[0].x_in
    assert float(d_noise.mean()) == pytest.approx(float(d_real.mean()), abs=0.05 * float(d_real.std()))
    assert float(d_noise.std()) == pytest.approx(float(d_real.std()), rel=0.05)
    assert not torch.allclose(real[1].x_in, noisy[1].x_in)  # the noise propagates
    before = {n: w.detach().clone() for n, w in m.model.named_parameters()}
    q = m.attention_layers[0].q_proj.weight
    q_name = next(n for n, w in m.model.named_parameters() if w is q)
    with pytest.raises(RuntimeError, match="inside"), noised_qkv(m, seed=3):
        assert not torch.equal(q, before[q_name])
        assert float(q.detach().mean()) == pytest.approx(float(before[q_name].mean()), abs=0.01)
        assert float(q.detach().std()) == pytest.approx(float(before[q_name].std()), rel=0.05)
        raise RuntimeError("an error inside the block must still restore the weights")
    for n, w in m.model.named_parameters():
        assert torch.equal(w, before[n]), n


def _direct_rid(x: torch.Tensor, x_new: torch.Tensor) -> float:
    """RID (docs/methods.md#erank-and-rid) by a full numpy SVD: |ΔeRank| / min(S, H) + the share of X' outside X's support."""
    x, x_new = x.double().numpy(), x_new.double().numpy()
    u, sigma, vt = np.linalg.svd(x)
    r = int((sigma > max(x.shape) * np.finfo(np.float32).eps * sigma[0]).sum())
    u_r, v_r = u[:, :r], vt[:r].T

    def erank(s):
        p = s / s.sum()
        p = p[p > 0]
        return np.exp(-(p * np.log(p)).sum())

    d_s = abs(erank(np.linalg.svd(x_new, compute_uv=False)) - erank(sigma)) / min(x.shape)
    cols = np.linalg.norm(x_new - u_r @ (u_r.T @ x_new))
    rows = np.linalg.norm(x_new - (x_new @ v_r) @ v_r.T)
    return d_s + (cols + rows) / (2 * np.linalg.norm(x_new))


def _direct_tme(x: torch.Tensor, alpha: float) -> float:
    """Mean row entropy of P ∝ ((cos + 1) / 2)^α over log S, from the dense S x S cosine matrix."""
    n = x.double().numpy()
    n = n / np.linalg.norm(n, axis=1, keepdims=True)
    w = ((np.clip(n @ n.T, -1, 1) + 1) / 2) ** alpha
    return float(scipy.stats.entropy(w, axis=1).mean() / np.log(len(n)))


def _modules(m, p, identity_rope_at: int | None = None) -> dict:
    """Each layer's input, attention output Δ and output, read by hooks on the layer and its `self_attn`.

    `identity_rope_at`: that layer's attention gets the identity rotation (cos 1, sin 0); the layers before
    it run as usual, so its Δ is the RoPE-free attention output on the real input.
    """
    seen: dict = {"in": {}, "delta": {}, "out": {}}
    handles = []

    def no_rope(mod, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        return args, {**kwargs, "position_embeddings": (torch.ones_like(cos), torch.zeros_like(sin))}

    for i, layer in enumerate(decoder_layers(m)):
        handles.append(
            layer.register_forward_pre_hook(
                lambda mod, a, kw, i=i: seen["in"].__setitem__(i, (a[0] if a else kw["hidden_states"])[0]),
                with_kwargs=True,
            )
        )
        handles.append(
            layer.self_attn.register_forward_hook(
                lambda mod, a, out, i=i: seen["delta"].__setitem__(i, out[0][0])
            )
        )
        handles.append(
            layer.register_forward_hook(
                lambda mod, a, out, i=i: seen["out"].__setitem__(
                    i, out[0][0] if isinstance(out, tuple) else out[0]
                )
            )
        )
        if i == identity_rope_at:
            handles.append(layer.self_attn.register_forward_pre_hook(no_rope, with_kwargs=True))
    try:
        with torch.no_grad():
            m.model(**p.inputs, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_flow_rows_against_a_direct_computation(tiny_dir, data):
    m = corelens.load(tiny_dir("qwen3_vl"))  # deepstack: layer inputs are not layer outputs; q_norm / k_norm
    sample, p = _inputs(m, data)
    seen = _modules(m, p)
    for opts in (FlowOptions(), FlowOptions(reference="layer", alpha=1.0, rope_on="residual")):
        rows, tokens = measure_flow(m, sample, "none", opts)
        assert tokens == p.seq_len
        by = {(r["layer"], r["module"]): r for r in rows}
        for layer in range(m.num_layers):
            x_in, delta = seen["in"][layer], seen["delta"][layer]
            x_mid, x_out = x_in + delta, seen["out"][layer]  # the layer's own residual add
            plain = _modules(m, p, identity_rope_at=layer)["delta"][layer]
            pairs = {
                "attn": (x_in, x_mid),
                "ffn": (x_in if opts.reference == "layer" else x_mid, x_out),
                "rope": (plain, delta) if opts.rope_on == "delta" else (x_in + plain, x_mid),
            }
            for module, (x, x_new) in pairs.items():
                got = by[(layer, module)]
                assert got["rid"] == pytest.approx(_direct_rid(x.float(), x_new.float()), rel=1e-6), module
                if module != "rope":
                    t_in, t_out = _direct_tme(x.float(), opts.alpha), _direct_tme(x_new.float(), opts.alpha)
                    assert got["tme_in"] == pytest.approx(t_in, rel=1e-9)
                    assert got["mixig"] == pytest.approx(t_out - t_in, rel=1e-6, abs=1e-12)
    assert FlowOptions().alpha == 16.0  # the documented default (docs/methods.md, results/tme-alpha.csv)


def test_flow_run_dir_resume_and_cli(tiny_dir, data, tmp_path):
    path = tiny_dir("qwen2_5_vl")
    m = corelens.load(path)
    out = tmp_path / "run"
    first = flow(m, data, out=out)
    table = pd.read_csv(out / "table1.csv")
    assert table["row"].tolist() == ["attention", "FFN", "noise Δ", "noise QKV", "ε_RoPE"]
    assert (table["samples"] == 2).all() and table[["rid", "dS", "dD"]].notna().all().all()
    assert table.loc[table["row"] != "ε_RoPE", "mixig"].notna().all()
    frame = pd.read_parquet(out / "flow.parquet")
    assert len(frame) == 2 * m.num_layers * (
        3 + 2 + 2
    )  # none: attn, ffn, rope; two noise baselines: attn, ffn
    rope = frame[frame["module"] == "rope"].groupby("sample_id")["rid"].mean().mean()
    assert table.set_index("row").loc["ε_RoPE", "rid"] == pytest.approx(rope, rel=1e-12)
    assert (table["alpha"] == 16.0).all() and (table["rope_on"] == "delta").all()  # the settings, recorded
    assert (out / "figures" / "flow_layers.png").stat().st_size > 1000
    lines = (out / "samples.jsonl").read_text().splitlines()
    again = flow(m, data, out=out)  # resumed: nothing is redone
    assert (out / "samples.jsonl").read_text().splitlines() == lines
    pd.testing.assert_frame_equal(first.table, again.table)
    assert json.loads((out / "manifest.json").read_text())["resumed"] == 1
    cli_out = tmp_path / "cli"
    args = ["flow", "--model", str(path), "--data", str(data), "--out", str(cli_out), "--baseline", "none"]
    assert (
        main([*args, "--limit", "1", "--positions", "visual", "--rank", "energy", "--rope-on", "residual"])
        == 0
    )
    frame = pd.read_parquet(cli_out / "flow.parquet")
    assert json.loads((cli_out / "manifest.json").read_text())["settings"]["rope_on"] == "residual"
    assert set(frame["baseline"]) == {"none"} and frame["sample_id"].nunique() == 1
    assert main([*args, "--limit", "1"]) == 2  # other settings on the same run dir: refused


def test_flow_benchmark_small(tmp_path):
    out = tmp_path / "flow.json"
    assert main(["bench", "flow", "--tokens", "96", "--hidden", "64", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["direct_s"] > 0 and result["corelens_s"] > 0 and result["speedup"] > 0
    assert result["max_rel_diff"] < 1e-6
    assert set(result["rel_diff"]) == {
        "rid",
        "dS",
        "dD",
        "erank_in",
        "erank_out",
        "tme_in",
        "tme_out",
        "mixig",
    }
