"""Head scorers (`rank --score`): each against a reference computed independently of its probe (eager
attention with `output_attentions`, importance's own run), RAM unchanged, the registry, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import corelens
from corelens.cli import main
from corelens.experiments.rank import rank
from corelens.experiments.scorers import SCORERS, Scorer
from corelens.organism.tasks import WORDS, generate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("scorers")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    return model, generate("image", root / "data", 4, seed=3)


def _eager(model, data, answer: bool):
    """Yield (sample, prepared, attentions (layers, heads, q, k) fp64) from the eager model, one per sample."""
    from corelens.models.tiny import load_tiny

    m = corelens.load(model)
    eager, _ = load_tiny(model, attn_implementation="eager")
    for sample in corelens.read_samples(data)[0]:
        prepared = corelens.prepare(m, sample, answer=sample.answer if answer else None)
        with torch.no_grad():
            att = eager(**prepared.inputs, output_attentions=True, use_cache=False).attentions
        yield sample, prepared, np.stack([a[0].double().numpy() for a in att])


def _by_sample(ranking) -> dict[str, np.ndarray]:
    """Return {sample id: (layers, heads) score} from a ranking's per-sample table."""
    out = {}
    for sample_id, frame in ranking.ram.groupby("sample_id"):
        frame = frame.sort_values(["layer", "head"])
        out[sample_id] = frame["mass"].to_numpy().reshape(frame["layer"].max() + 1, -1)
    return out


def test_the_choices_are_the_registry():
    """`rank --score` lists its choices without importing the scorers: they must be the registry's names."""
    from corelens.choices import HEAD_SCORES  # read from the source: tests/test_registered.py

    assert sorted(HEAD_SCORES) == sorted(SCORERS)


@pytest.mark.parametrize("name", sorted(SCORERS))
def test_a_scorer_round_trips_as_a_dict(name):
    scorer = SCORERS[name]()
    assert Scorer.from_dict(json.loads(json.dumps(scorer.to_dict()))) == scorer
    assert scorer.to_dict()["name"] == name


def test_bad_scorer_names_and_settings_are_one_line_errors():
    from corelens.errors import OptionError

    with pytest.raises(OptionError, match="unknown head scorer 'nope'; known: .*ram"):
        Scorer.from_dict({"name": "nope"})
    with pytest.raises(OptionError, match=r"unknown setting\(s\) \['wide'\]"):
        Scorer.from_dict({"name": "outside-window", "wide": 3})


def test_retrieval_is_the_top_key_in_omega_over_omega(tiny):
    """Per sample and head: the share of answer-predicting rows whose top-1 key (eager attention) is in Ω,
    over |Ω|; every answer counted (a random tiny model is rarely right)."""
    model, data = tiny
    ranking = rank(corelens.load(model), data, score={"name": "retrieval", "all_answers": True}, k=None)
    got = _by_sample(ranking)
    for sample, prepared, att in _eager(model, data, answer=True):
        omega = prepared.layout.omega(sample.targets, "any", sample=sample.id)
        rows = np.asarray(prepared.answer_rows) - 1
        top = att[:, :, rows].argmax(-1)  # (layers, heads, rows)
        want = np.isin(top, omega).mean(-1) / len(omega)
        np.testing.assert_allclose(got[sample.id], want, atol=1e-12)
    assert ranking.heads["mass"].max() > 0  # some head's top key lands in Ω: the comparison is not all zeros


def test_retrieval_counts_correct_answers_only(tiny):
    """A random tiny model answers no sample right: with correct answers only, no sample is left to rank."""
    from corelens.errors import InputError

    model, data = tiny
    with pytest.raises(InputError, match="answered wrongly"):
        rank(corelens.load(model), data, score="retrieval", k=None)


@pytest.mark.parametrize(("sink", "window"), [(2, 3), (0, 1)])
def test_outside_window_is_the_mass_a_streaming_head_loses(tiny, sink, window):
    """Per sample and head: mean over the question rows of the eager attention on keys S <= k <= r - W."""
    model, data = tiny
    m = corelens.load(model)
    ranking = rank(m, data, score="outside-window", sink=str(sink), window=str(window), k=None)
    got = _by_sample(ranking)
    for sample, prepared, att in _eager(model, data, answer=False):
        rows = np.asarray(prepared.question_rows)
        lost = [att[:, :, r, sink : max(sink, r - window + 1)].sum(-1) for r in rows]
        np.testing.assert_allclose(got[sample.id], np.mean(lost, axis=0), rtol=1e-5, atol=1e-7)


def test_outside_window_takes_shares_of_each_prompt(tiny):
    from corelens.experiments.scorers.outside_window import OutsideWindow

    assert OutsideWindow(sink="10%", window="50%").sizes(40) == (4, 20)
    model, data = tiny
    counts = rank(corelens.load(model), data, score="outside-window", sink="1", window="2", k=None)
    share = OutsideWindow(sink="1", window="2").sizes(999)
    assert share == (1, 2) and counts.heads["mass"].between(0, 1).all()


@pytest.mark.e2e
def test_causal_is_importances_single_head_effect(tiny, tmp_path):
    """The causal scorer's per-sample drops equal `corelens importance`'s exact log-p drops."""
    from corelens.experiments.importance import measure

    model, data = tiny
    m = corelens.load(model)
    ranking = rank(m, data, score="causal", k=None, out=tmp_path / "causal")
    effects = measure(
        m, data, tmp_path / "causal" / "heads.csv", method="exact", allow_same_data=True, draws=10
    )
    records = effects["records"]
    got = _by_sample(ranking)
    for sample_id, frame in records.groupby("sample"):
        frame = frame.sort_values(["layer", "head"])
        want = frame["drop_logp"].to_numpy().reshape(got[sample_id].shape)
        np.testing.assert_allclose(got[sample_id], want, rtol=1e-9, atol=1e-9)
    assert np.abs(ranking.heads["mass"]).max() > 0


def test_causal_attribution_is_importances_estimate(tiny):
    from corelens.experiments.importance import attribution

    model, data = tiny
    m = corelens.load(model)
    got = _by_sample(rank(m, data, score="causal", effect="attribution", k=None))
    for sample in corelens.read_samples(data)[0]:
        forced = corelens.prepare(m, sample, answer=sample.answer)
        np.testing.assert_allclose(
            got[sample.id], attribution(m, sample, forced, "zero", "visual"), atol=1e-9
        )


def test_ram_is_the_default_and_unchanged(tiny):
    model, data = tiny
    m = corelens.load(model)
    default, named = rank(m, data, k=None), rank(m, data, score="ram", k=None)
    pd.testing.assert_frame_equal(default.heads, named.heads)
    pd.testing.assert_frame_equal(default.ram.drop(columns="views"), named.ram.drop(columns="views"))


def test_score_on_the_command_line_records_the_scorer(tiny, tmp_path, capsys):
    """`rank --score` writes the usual tables at both granularities; manifest and headset.json name the scorer."""
    model, data = tiny
    out = tmp_path / "run"
    argv = ["rank", "--model", str(model), "--data", str(data), "--out", str(out), "--overlays", "0"]
    assert main([*argv, "--score", "outside-window", "--sink", "2", "--window", "3", "--k", "2"]) == 0
    heads = pd.read_csv(out / "heads.csv")
    assert {"mass", "rank", "mass_low", "mass_high", "p_top2"} <= set(heads.columns) and len(heads) == 8
    manifest = json.loads((out / "manifest.json").read_text())
    score = {"name": "outside-window", "sink": "2", "window": "3"}
    assert manifest["settings"]["score"] == score
    assert main(["export", str(out), "--out", str(tmp_path / "hs")]) == 0
    assert json.loads((tmp_path / "hs" / "headset.json").read_text())["provenance"]["score"] == score
    # A resumed run with another scorer is refused; KV granularity is post-processing of the same records.
    assert (
        main([*argv, "--score", "outside-window", "--sink", "2", "--window", "3", "--granularity", "kv"]) == 0
    )
    assert len(pd.read_csv(out / "heads.csv")) == 4
    assert "top KV heads (sum of their query heads' outside-window score)" in capsys.readouterr().out


@pytest.mark.e2e
def test_every_scorer_ranks_the_organism_from_the_command_line(tmp_path):
    """End to end on the organism (6 samples): each scorer ranks its 32 heads with intervals."""
    from corelens.organism import organism_path

    data = generate("image", tmp_path / "data", 6, seed=1)
    for name in ("retrieval", "outside-window", "causal"):
        out = tmp_path / name
        extra = ["--sink", "4", "--window", "16"] if name == "outside-window" else []
        argv = [
            "rank",
            "--model",
            str(organism_path()),
            "--data",
            str(data),
            "--out",
            str(out),
            "--query",
            "answer",
        ]
        assert main([*argv, "--score", name, "--overlays", "0", "--k", "4", *extra]) == 0
        heads = pd.read_csv(out / "heads.csv")
        assert len(heads) == 32 and heads["n"].eq(6).all() and heads["p_top4"].sum() == pytest.approx(4)
        assert json.loads((out / "manifest.json").read_text())["settings"]["score"]["name"] == name


def test_the_report_names_the_scorer_of_a_rank_run(tiny, tmp_path):
    """The report's finding of a rank run by another score names that score, not RAM (nor its lift)."""
    from corelens.report.summary import summary_section

    model, data = tiny
    m = corelens.load(model)
    said = {}
    for name in ("ram", "outside-window"):
        rank(m, data, score=name, sink="2", window="3", k=None, out=tmp_path / name)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        said[name] = str(summary_section([tmp_path / name], [manifest]))
    assert "(RAM)" in said["ram"] and "lift" in said["ram"]
    assert "ranked highest by the outside-window score" in said["outside-window"]
    assert "RAM" not in said["outside-window"] and "lift" not in said["outside-window"]
