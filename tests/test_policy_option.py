"""`corelens ablate --policy`: any registered policy on a set of heads, with its parameters, from the command
line; recorded whole in the run folder so that the run can be repeated from it; `--op` its short form."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from corelens.cli import main


@pytest.fixture(scope="module")
def ranked(tiny_dir, tmp_path_factory):
    """A tiny model, its heads ranked on one file and a second file to evaluate on."""
    from corelens.organism.tasks import generate

    tmp = tmp_path_factory.mktemp("policy-option")
    model = tiny_dir("qwen2_5_vl", kv_heads=2)
    ident = generate("image", tmp / "ident", 2, seed=1)
    data = generate("image", tmp / "eval", 2, seed=2)
    assert main(["rank", "--model", str(model), "--data", str(ident), "--out", str(tmp / "rank")]) == 0
    return model, tmp / "rank" / "heads.csv", data


def _ablate(ranked, out, *options) -> list[str]:
    model, heads, data = ranked
    return ["ablate", "--model", str(model), "--heads", str(heads), "--data", str(data), "--n-heads", "2",
            "--sets", "top,random", "--draws", "2", "--max-new-tokens", "2", "--out", str(out), *options]  # fmt: skip


def test_a_policy_with_parameters_equals_its_short_form_and_is_recorded_whole(ranked, tmp_path):
    knock = {"name": "knockout", "keys": "omega"}
    assert main(_ablate(ranked, tmp_path / "op", "--op", "knockout", "--keys", "omega")) == 0
    assert main(_ablate(ranked, tmp_path / "json", "--policy", json.dumps(knock))) == 0
    path = tmp_path / "knockout.json"
    path.write_text(json.dumps(knock))
    assert main(_ablate(ranked, tmp_path / "file", "--policy", str(path))) == 0
    tables = [(tmp_path / run / "ablation.csv").read_bytes() for run in ("op", "json", "file")]
    assert tables[0] == tables[1] == tables[2]
    assert pd.read_csv(tmp_path / "json" / "ablation.csv")["keys"].eq("omega").all()
    for run in ("op", "json"):
        manifest = json.loads((tmp_path / run / "manifest.json").read_text())
        assert manifest["policy"] == {"name": "knockout", "keys": "omega"}
        assert manifest["settings"]["op"] == "knockout" and "policy" not in manifest["settings"]  # as before
        sets = json.loads((tmp_path / run / "headsets.json").read_text())
        for entry in sets:  # each condition's whole policy: a file any integration loads
            assert entry["policy"] == {"name": "knockout", "keys": "omega", "heads": entry["heads"],
                                       "label": entry["label"], "seed": entry["seed"], "meta": entry["meta"]}  # fmt: skip


def test_a_parameter_that_is_not_the_default_is_a_setting_of_the_run(ranked, tmp_path, capsys):
    """A resume with another parameter is refused like any other changed setting; the manifest's `policy`
    repeats the run."""
    from corelens.policies import Policy

    out = tmp_path / "mean"
    refs = str(ranked[2])
    plain = _ablate(ranked, out, "--policy", "mean", "--reference", refs)
    assert main(plain) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["policy"] == {"name": "mean", "means": None} and "policy" not in manifest["settings"]
    # The statistics of that run, given as the policy's parameter, make the same answers without a reference.
    given = {"name": "mean", "means": str(out / "means.npz")}
    again = _ablate(ranked, tmp_path / "given", "--policy", json.dumps(given))
    assert main(again) == 0
    assert (tmp_path / "given" / "ablation.csv").read_bytes() == (out / "ablation.csv").read_bytes()
    manifest = json.loads((tmp_path / "given" / "manifest.json").read_text())
    assert manifest["settings"]["policy"] == given and not (tmp_path / "given" / "means.npz").exists()
    assert Policy.from_dict(manifest["policy"]).means == given["means"]
    capsys.readouterr()
    other = {"name": "mean", "means": str(tmp_path / "given" / "other.npz")}
    assert main(_ablate(ranked, tmp_path / "given", "--policy", json.dumps(other))) != 0
    assert "other settings (policy)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            ["--policy", "hybrid"],
            "unknown ablation policy 'hybrid'; expected one of knockout, mean, uniform, zero",
        ),
        (["--policy", '{"name": "zero", "heads": [[0, 1]]}'], "['heads'] are filled from each head set"),
        (["--policy", '{"name": "knockout", "keys": 3}'], "field 'keys'"),
        (["--policy", '{"name": "knockout", "keyz": "omega"}'], "unknown field(s) ['keyz']"),
        (["--policy", "knockout", "--keys", "omega"], "not both"),
        (["--policy", '{"name": "zero", "name": "mean"}'], "key 'name' is repeated"),
        (["--op", "hybrid"], "invalid choice: 'hybrid'"),
    ],
)
def test_a_bad_policy_is_one_line_before_the_model_loads(
    ranked, tmp_path, capsys, monkeypatch, options, said
):
    import corelens.models.loaded as loaded

    monkeypatch.setattr(loaded, "load", lambda *a, **k: pytest.fail("the model loaded"))
    code = main(_ablate(ranked, tmp_path / "bad", *options))
    err = capsys.readouterr().err
    assert code != 0 and said in err and "Traceback" not in err, err
    assert not (tmp_path / "bad").exists()


def test_a_command_says_what_it_loads_and_sweeps_on_a_terminal_only(ranked, tmp_path, capsys, monkeypatch):
    """On a terminal (or CORELENS_PROGRESS=1): torch's import and the model's load with their seconds, the
    sweep's conditions, each round of --draws auto; a pipe (a test, a script reading the error) sees none."""
    import re

    monkeypatch.setenv("CORELENS_PROGRESS", "1")
    capsys.readouterr()
    assert main(_ablate(ranked, tmp_path / "said")) == 0
    err = capsys.readouterr().err
    assert re.search(r"^corelens ablate: importing torch and transformers \.\.\. \d+\.\d s$", err, re.M), err
    assert re.search(
        r"^corelens: loaded \S+ \(qwen2_5_vl, \d+ layers x \d+ heads, float32 on cpu\) in \d", err, re.M
    )
    assert re.search(
        r"^ablate: 4 conditions \(the model as it is; sets top, random at k 2\) x 2 samples$", err, re.M
    )
    monkeypatch.delenv("CORELENS_PROGRESS")
    assert main(_ablate(ranked, tmp_path / "quiet")) == 0
    err = capsys.readouterr().err
    assert "importing torch" not in err and "corelens: loaded" not in err


def _hybrid(ranked, out, *options) -> list[str]:
    model, heads, data = ranked
    return ["hybrid", "--model", str(model), "--heads", str(heads), "--data", str(data), "--n-heads", "25%",
            "--sets", "top", "--sink", "2", "--window", "8", "--max-new-tokens", "2", "--out", str(out), *options]  # fmt: skip


def test_hybrid_takes_its_policy_with_parameters_too(ranked, tmp_path, capsys, monkeypatch):
    stream = {"name": "hybrid", "decode": "stream", "kernel": "blocked"}
    assert main(_hybrid(ranked, tmp_path / "opts", "--decode", "stream", "--kernel", "blocked")) == 0
    assert main(_hybrid(ranked, tmp_path / "json", "--policy", json.dumps(stream))) == 0
    table = (tmp_path / "json" / "hybrid.csv").read_bytes()
    assert table == (tmp_path / "opts" / "hybrid.csv").read_bytes()
    assert pd.read_csv(tmp_path / "json" / "hybrid.csv")["cache_saved_fraction"].iloc[1] > 0  # it streamed
    manifest = json.loads((tmp_path / "json" / "manifest.json").read_text())
    assert manifest["policy"] == {
        "name": "hybrid",
        "decode": "stream",
        "kernel": "blocked",
        "dense_below": 1.1,
    }
    entry = json.loads((tmp_path / "json" / "policies.json").read_text())[1]["policy"]
    assert {k: entry[k] for k in ("name", "decode", "kernel", "sink", "window")} == {
        **stream,
        "sink": 2,
        "window": 8,
    }
    import corelens.models.loaded as loaded

    monkeypatch.setattr(loaded, "load", lambda *a, **k: pytest.fail("the model loaded"))
    for options, said in [
        (["--policy", '{"name": "hybrid", "window": 64}'], "leave 'sink' and 'window' out"),
        (["--policy", "hybrid", "--decode", "stream"], "not both"),
        (["--policy", "zero"], "unknown hybrid policy 'zero'; expected one of hybrid"),
    ]:
        capsys.readouterr()
        assert main(_hybrid(ranked, tmp_path / "bad", *options)) != 0
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err


def test_a_rerun_with_other_settings_is_refused_before_torch_loads(ranked, tmp_path, capsys, monkeypatch):
    """The run folder's refusal, given before the model loads: another --n-heads, another command; the same
    command resumes, and a folder whose run logged nothing never blocks."""
    import sys

    import corelens.models.loaded as loaded

    out = tmp_path / "run"
    first = _ablate(ranked, out)
    monkeypatch.setattr(sys, "argv", ["corelens", *first])  # what the manifest records
    assert main(first) == 0
    real = loaded.load
    monkeypatch.setattr(loaded, "load", lambda *a, **k: pytest.fail("the model loaded"))
    other = [*first[: first.index("--n-heads") + 1], "3", *first[first.index("--n-heads") + 2 :]]
    for argv, said in [(other, "holds a 'ablate' run with other settings (k)"),
                       ([*first, "--op", "uniform"], "other settings (op)"),
                       (_hybrid(ranked, out), "holds a 'ablate' run with other settings (command)")]:  # fmt: skip
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
    monkeypatch.setattr(loaded, "load", real)
    assert main(first) == 0  # the same settings: resumed
    assert "resumed" in capsys.readouterr().err
