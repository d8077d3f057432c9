"""`corelens importance` (docs/importance.md): the answer's log p against an independent computation, each
single-head effect against an o_proj reference, attribution patching against finite differences and the exact
effects on the organism, the CLI end to end, resume, and the report's finding and figure."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

import corelens
from corelens.attention.attribution import HeadGate
from corelens.data.sample import load_images
from corelens.experiments.importance import answer_logp, attribution, blocked_positions
from corelens.metrics.causal_effects import agreement, importance_table
from corelens.models.prepare import messages, prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.policies import KnockoutHeads, ZeroHeads

MODEL = str(organism_path())


@pytest.fixture(scope="module")
def organism():
    return corelens.load(MODEL, device="cpu")


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    path = generate("image", tmp_path_factory.mktemp("importance"), 4, seed=3)
    return corelens.read_samples(path)[0]


def _stock_logp(m, sample) -> float:
    """log p(gold) from the whole sequence's logits, the answer's ids found by the tokenizer alone."""
    processor = m.processor
    prompt = processor.apply_chat_template(messages(sample), add_generation_prompt=True,
                                           tokenize=False)  # fmt: skip
    images = load_images(sample)
    inputs = processor(text=[prompt + sample.answer], images=images, return_tensors="pt")
    gold = processor.tokenizer(sample.answer, add_special_tokens=False)["input_ids"]
    ids = inputs["input_ids"][0]
    assert ids[-len(gold) :].tolist() == gold  # the answer is the sequence's tail
    with torch.no_grad():
        logits = m.model(**inputs, use_cache=False).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    start = len(ids) - len(gold)
    return float(sum(logp[start - 1 + i, t] for i, t in enumerate(gold)))


def _gated(m, forced, op, blocked, heads, value) -> float:
    gate = HeadGate(m, op, blocked)
    for layer, head in heads:
        gate.gates[layer, head] = value
    with torch.no_grad(), gate.installed():
        return float(answer_logp(m, forced))


def test_logp_parity_with_the_stock_model_and_an_idle_gate(organism, samples):
    m = organism
    for sample in samples[:1]:
        forced = prepare(m, sample, answer=sample.answer)
        with torch.no_grad():
            ours = float(answer_logp(m, forced))
        assert abs(ours - _stock_logp(m, sample)) <= 1e-5
        assert abs(_gated(m, forced, "zero", None, [], 0.0) - ours) <= 1e-9  # s = 0: the model unchanged


def test_single_head_effect_equals_zeroed_o_proj_columns(organism, samples):
    """Zeroing one head (the operator `importance` uses) = that head's o_proj input columns zeroed by a
    forward pre-hook; the gate at s = 1 is the same intervention."""
    m, d = organism, organism.text_config.head_dim
    sample = samples[0]
    forced = prepare(m, sample, answer=sample.answer)
    for layer, head in [(0, 6), (2, 3)]:
        with torch.no_grad(), ZeroHeads([(layer, head)]).applied(m, forced):
            ours = float(answer_logp(m, forced))

        def zero(module, args, head=head):
            x = args[0].clone()
            x[..., head * d : (head + 1) * d] = 0
            return (x,)

        handle = m.attention_layers[layer].o_proj.register_forward_pre_hook(zero)
        try:
            reference = _stock_logp(m, sample)
        finally:
            handle.remove()
        assert abs(ours - reference) <= 1e-5
        assert abs(_gated(m, forced, "zero", None, [(layer, head)], 1.0) - ours) <= 1e-5


def test_knockout_gate_at_one_equals_the_knockout_operator(organism, samples):
    m, sample = organism, samples[1]
    forced = prepare(m, sample, answer=sample.answer)
    blocked = blocked_positions(sample, forced, "knockout", "visual")
    for head in [(0, 5), (1, 2)]:
        with torch.no_grad(), KnockoutHeads([head]).applied(m, forced, sample=sample):
            ours = float(answer_logp(m, forced))
        assert abs(_gated(m, forced, "knockout", blocked, [head], 1.0) - ours) <= 1e-5


@pytest.mark.parametrize("keys", ["visual", "omega"])
def test_one_knockout_gate_reads_each_prompts_blocked_keys_from_the_context(organism, samples, keys):
    """A knockout gate built without positions blocks each prompt's `keys` as read from the call's context,
    serving two prompts and giving exactly what gates built with each prompt's blocked positions give."""
    from corelens.attention.prompt_context import AttentionContext, attention_context
    from corelens.errors import CorelensError

    m = organism
    gate = HeadGate(m, "knockout", keys=keys)
    gate.gates[0, 5] = gate.gates[1, 2] = 1.0
    chosen = [s for s in samples if s.targets][:2]
    assert len(chosen) == 2
    for sample in chosen:
        forced = prepare(m, sample, answer=sample.answer)
        blocked = blocked_positions(sample, forced, "knockout", keys)
        omega = forced.layout.omega(sample.targets, "any", sample=sample.id)
        with torch.no_grad(), attention_context(AttentionContext.of(forced, omega=omega)), gate.installed():
            got = float(answer_logp(m, forced))
        assert got == _gated(m, forced, "knockout", blocked, [(0, 5), (1, 2)], 1.0)
        assert got != _gated(m, forced, "zero", None, [], 0.0)  # the knockout moved log p
    no_context = pytest.raises(CorelensError, match="head gate needs the prompt's positions")
    with no_context, torch.no_grad(), gate.installed():
        answer_logp(m, forced)


@pytest.mark.parametrize("op", ["zero", "knockout"])
def test_attribution_equals_the_gate_finite_difference(organism, samples, op):
    """The gradient is the derivative of log p in each head's gate: a central difference with a tiny step."""
    m, sample = organism, samples[2]
    forced = prepare(m, sample, answer="red ring")  # a wrong answer: log p far from 0, gradients not tiny
    blocked = blocked_positions(sample, forced, op, "visual")
    drops = attribution(m, sample, forced, op, "visual")
    eps = 1e-2
    for head in [(0, 5), (1, 0)]:
        fd = (_gated(m, forced, op, blocked, [head], eps) - _gated(m, forced, op, blocked, [head], -eps)) / (
            2 * eps
        )
        assert abs(-drops[head] - fd) <= 1e-3 * max(1.0, abs(fd)), (head, -drops[head], fd)
    assert np.abs(drops).max() > 1e-2  # the heads matter for this answer


def _every_single_head(m, forced) -> np.ndarray:
    """Return every head's exact zeroing drop of log p (layers, heads) from one batched forward: copy 0 is the
    unmodified model, copy 1 + i has head i's gate at 1 (the zero operator, tested above)."""
    heads = m.num_layers * m.num_heads
    gate = HeadGate(m, "zero", batch=heads + 1)
    gate.gates.view(heads + 1, heads)[1:] = torch.eye(heads)
    inputs = {
        k: torch.cat([v] * (heads + 1)) if isinstance(v, torch.Tensor) else v
        for k, v in forced.inputs.items()
    }
    rows = torch.as_tensor(forced.answer_rows)
    with torch.no_grad(), gate.installed():
        logits = m.model(**inputs, use_cache=False).logits.double()
    logp = (
        torch.log_softmax(logits[:, rows - 1], -1).gather(-1, inputs["input_ids"][:, rows, None]).sum((1, 2))
    )
    return (logp[0] - logp[1:]).view(m.num_layers, m.num_heads).numpy()


def test_attribution_tracks_the_exact_effects_on_the_organism(organism, samples):
    """Spearman of attribution against the exact zeroing effects (4 image samples): over (sample, head)
    pairs, and over the heads' mean effects."""
    m = organism
    sample = samples[0]
    forced = prepare(m, sample, answer=sample.answer)
    with torch.no_grad():
        base = float(answer_logp(m, forced))
        with ZeroHeads([(0, 6)]).applied(m, forced):
            drop = base - float(answer_logp(m, forced))
    exact = [_every_single_head(m, forced)]
    assert exact[0][0, 6] == pytest.approx(drop, abs=1e-5)  # the batched copies = the operator, one by one
    estimate = [attribution(m, sample, forced, "zero", "visual")]
    for sample in samples[1:]:
        forced = prepare(m, sample, answer=sample.answer)
        exact.append(_every_single_head(m, forced))
        estimate.append(attribution(m, sample, forced, "zero", "visual"))
    exact, estimate = np.array(exact).reshape(len(samples), -1), np.array(estimate).reshape(len(samples), -1)
    pairs = stats.spearmanr(exact.ravel(), estimate.ravel()).statistic
    heads = stats.spearmanr(exact.mean(0), estimate.mean(0)).statistic
    print("attribution vs exact: Spearman pairs", pairs, "heads", heads)
    assert pairs >= 0.7 and heads >= 0.45, (pairs, heads)  # measured 0.80 / 0.64


def test_importance_table_ranks_and_disagreement():
    heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "mass": [0.4, 0.3, 0.2, 0.1],
                          "rank": [1, 2, 3, 4]})  # fmt: skip
    drops = np.array([[0.0, 1.0, 2.0, 3.0], [0.1, 1.1, 2.1, 3.1], [0.0, 0.9, 1.9, 2.9]])
    table = importance_table(heads, drops, np.zeros((3, 4)), draws=300)
    assert table["causal_rank"].tolist() == [4, 3, 2, 1]
    assert (table["drop_logp_low"] <= table["drop_logp"]).all() and (
        table["drop_logp"] <= table["drop_logp_high"]
    ).all()
    info = agreement(table, drops, None, draws=300)
    assert info["spearman"] == pytest.approx(-1.0) and info["high"] < 0
    assert [d["head"] for d in info["disagree"][:2]] == ["L1H1", "L0H0"]  # rank differences 3 and -3


def _rank_run(tmp_path, data, layers: int = 4, heads: int = 8) -> str:
    """A rank run's heads.csv and manifest (recording the data it ranked) without running rank."""
    run = tmp_path / "rank"
    run.mkdir()
    total = layers * heads
    rows = [f"{i // heads},{i % heads},{(total - i) / (2 * total)},{i + 1}" for i in range(total)]
    (run / "heads.csv").write_text("layer,head,mass,rank\n" + "\n".join(rows) + "\n")
    manifest = {"command": "rank", "settings": {"data": str(data), "data_sha256": "0" * 64}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    return str(run / "heads.csv")


def _tiny_data(tmp_path, n: int = 3):
    from helpers import noise_image

    lines = []
    for i in range(n):
        noise_image(96, 80, seed=i).save(tmp_path / f"{i}.png")
        lines.append({"id": f"s{i}", "task": "image", "images": [f"{i}.png"], "question": "what colour is the cup ?",
                      "answer": "red", "targets": [{"image": 0, "box": [10, 10, 60, 50]}]})  # fmt: skip
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.e2e
def test_cli_end_to_end_then_resume_and_report(tiny_dir, tmp_path):
    """A tiny Qwen2.5-VL (2 layers x 4 heads), two samples: the command, its tables, resume, the report."""
    model = str(tiny_dir("qwen2_5_vl"))
    data = _tiny_data(tmp_path, 2)
    heads = _rank_run(tmp_path, tmp_path / "elsewhere.jsonl", layers=2, heads=4)
    out = tmp_path / "run"
    argv = ["importance", "--model", model, "--device", "cpu", "--data", str(data), "--heads", heads,
            "--out", str(out), "--max-new-tokens", "2", "--draws", "200", "--op", "knockout"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "corelens", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert (
        "RAM and causal importance (knockout, exact log-p drop, 2 samples) agree with Spearman" in done.stderr
    )
    # Before it starts, what it will run (8 heads of 2 layers x 4, attribution by default beside exact).
    said = (
        "importance: per sample 9 answers (the model as it is and 8 single-head ablations) and one backward"
    )
    assert f"{said} (attribution) x 2 samples" in done.stderr
    table = pd.read_csv(out / "importance.csv")
    records = pd.read_parquet(out / "records.parquet")
    assert len(table) == 8 and len(records) == 16 and (out / "figures" / "ram_vs_causal.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 2 and -1 <= summary["low"] <= summary["spearman"] <= summary["high"] <= 1
    assert records["attribution"].notna().all() and records["drop_logp"].notna().all()

    # A record's exact drop against a reference computed here: the sample's log p minus its log p with the
    # head's visual keys knocked out (the operator checked against its own reference in tests/test_ablate.py).
    m = corelens.load(model, device="cpu")
    sample = corelens.read_samples(data)[0][1]
    forced = prepare(m, sample, answer=sample.answer)
    with torch.no_grad():
        base = float(answer_logp(m, forced))
        with KnockoutHeads([(1, 2)]).applied(m, forced, sample=sample):
            drop = base - float(answer_logp(m, forced))
    got = records[(records["sample"] == sample.id) & (records["layer"] == 1) & (records["head"] == 2)]
    assert got["drop_logp"].iloc[0] == pytest.approx(drop, abs=1e-6) and abs(drop) > 1e-6

    # Resume: drop the last three records of the log; the rerun measures only those and ends with equal tables.
    log = out / "samples.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-3]) + "\n")
    from corelens.cli import main

    assert main(argv) == 0
    assert len(log.read_text().splitlines()) == len(lines)
    pd.testing.assert_frame_equal(pd.read_csv(out / "importance.csv"), table)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed"] == 1 and manifest["processes"][0]["samples"] == 1

    from corelens.report.html import write_report

    page = write_report([out], tmp_path / "report.html").read_text()
    assert "RAM and causal importance (knockout of one head, exact drop of the answer's log p) agree" in page
    assert "ram_vs_causal.png" in page


def test_ram_vs_causal_labels_are_inside_the_image(monkeypatch):
    from test_report_figures import clipped, drawn_texts

    from corelens.report.figure import plt
    from corelens.report.ram_vs_causal import ram_vs_causal

    rng = np.random.default_rng(0)
    heads = pd.DataFrame({"layer": np.repeat(np.arange(4), 8), "head": np.tile(np.arange(8), 4),
                          "mass": rng.random(32), "rank": 0})  # fmt: skip
    heads["rank"] = heads["mass"].rank(ascending=False, method="first").astype(int)
    drops = rng.gamma(0.5, size=(6, 32))
    table = importance_table(heads, drops, np.zeros((6, 32)), draws=100)
    info = {**agreement(table, drops, None, draws=100), "effect": "exact", "op": "zero"}
    captured = {}
    monkeypatch.setattr(
        plt, "subplots", lambda *a, _s=plt.subplots, **k: captured.setdefault("f", _s(*a, **k))
    )
    monkeypatch.setattr("corelens.report.ram_vs_causal.save_figure", lambda fig, path: path)
    ram_vs_causal(table, "unused.png", info, title="image.jsonl")
    fig = captured["f"][0]
    texts, box = drawn_texts(fig, monkeypatch)
    labels = [t.get_text() for t, _ in texts if t.get_text().startswith("L")]
    assert len(labels) >= 8 and clipped(texts, box) == []
