"""Mistakes about the model are said before torch and the model load; a run refused before its first sample
does not block the corrected command (issue 44)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from corelens.commands.preflight import supported_types
from corelens.errors import CorelensError
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.runs.rundir import Run

PROBE = """
import contextlib, io, json, sys
from corelens.cli import main
said = {}
for name, argv in json.loads(sys.argv[1]).items():
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv)
    said[name] = {"code": code, "err": err.getvalue(), "torch": "torch" in sys.modules}
print(json.dumps(said))
"""


def test_the_supported_types_are_the_registered_families():
    from corelens.models.families import FAMILIES

    assert supported_types() == sorted(FAMILIES)


def test_a_wrong_model_is_refused_before_torch_loads_in_one_line(tmp_path):
    data = generate("image", tmp_path / "data", 2, seed=1)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    heads = tmp_path / "heads.csv"
    heads.write_text("layer,head,rank,mass\n0,0,1,0.5\n")
    common = ["--data", str(data), "--heads", str(heads), "--out", str(tmp_path / "run")]
    cases = {
        "gpt2": ["ablate", "--model", str(gpt2), *common],
        "data folder": ["ablate", "--model", str(data.parent), *common],
        "uncached id": ["hybrid", "--model", "Nobody/NoSuchModel-7B", *common],
        "too many heads": ["ablate", "--model", str(organism_path()), *common, "--n-heads", "3,40"],
        "too many kept": ["hybrid", "--model", str(organism_path()), *common, "--keep", "33"],
    }
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True,
                          check=True, timeout=300, env={**env, "PYTHONPATH": ":".join(sys.path)})  # fmt: skip
    said = json.loads(done.stdout)
    want = {
        "gpt2": "model_type 'gpt2' (config.json) is not a supported vision-language family; supported: ",
        "data folder": "no config.json); give the folder that holds config.json and the weights; it holds "
        "sample files (image.jsonl): give those with --data",
        "uncached id": "Nobody/NoSuchModel-7B: not in the hub cache",
        "too many heads": "--n-heads 40: the model has 32 heads (4 layers x 8); give at most 32, or a share",
        "too many kept": "--n-heads 33: the model has 32 heads",
    }
    for name, text in want.items():
        got = said[name]
        assert got["code"] == 2 and text in got["err"] and got["err"].count("\n") == 1, (name, got)
        assert not got["torch"], name  # said before torch was imported
    assert "download it first: `hf download Nobody/NoSuchModel-7B`" in said["uncached id"]["err"]
    assert not (tmp_path / "run").exists()  # nothing written for a refused command


def test_a_run_stopped_before_its_first_sample_does_not_block_the_corrected_one(tmp_path):
    out = tmp_path / "run"
    Run(out, "ablate", {"k": "40"}).lock.release()  # refused after opening (k above the model's heads)
    (out / "lengths.json").write_text("{}")
    run = Run(out, "ablate", {"k": "3"})  # the corrected command starts afresh
    assert json.loads((out / "manifest.json").read_text())["settings"] == {"k": "3"}
    assert not (out / "lengths.json").exists()
    (out / "samples.jsonl").write_text('{"id": "a", "status": "ok"}\n')
    run.lock.release()
    with pytest.raises(CorelensError, match="other settings"):  # a run with answers is still protected
        Run(out, "ablate", {"k": "5"})


def test_a_resumed_run_says_what_it_reuses(tmp_path, capsys):
    out = tmp_path / "run"
    Run(out, "ablate", {"k": "3"}).lock.release()
    (out / "samples.jsonl").write_text('{"id": "a", "status": "ok"}\n{"id": "b", "status": "ok"}\n')
    assert "resumed" not in capsys.readouterr().err  # a fresh run says nothing
    Run(out, "ablate", {"k": "3"}).lock.release()
    err = capsys.readouterr().err
    assert f"corelens: resumed {out}: 2 sample record(s) logged earlier (the run stopped) are reused" in err


def test_a_folder_given_as_data_names_the_sample_file_inside(tmp_path):
    from corelens.data import read_samples

    data = generate("image", tmp_path / "data", 1, seed=1)
    with pytest.raises(CorelensError, match=f"it holds image.jsonl: give {data}"):
        read_samples(data.parent)
