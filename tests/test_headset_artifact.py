"""Head-set artifacts: export a rank run, load it back (folder, headset.json, hub id), refuse another config."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

import corelens
from corelens.cli import main
from corelens.errors import CorelensError
from corelens.heads import HeadSet
from corelens.heads.artifact import checkpoint_identity
from corelens.organism.tasks import WORDS, generate

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """A tiny GQA checkpoint (2 layers x 4 heads over 2 KV heads), a rank run on it, and its export."""
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("artifact")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "data", 3, seed=5)
    run, out = root / "rank", root / "export"
    assert (
        main(["rank", "--model", str(model), "--data", str(data), "--out", str(run), "--overlays", "0"]) == 0
    )
    assert main(["export", str(run), "--out", str(out), "--keep", "3", "--to", "duo,sparsemm"]) == 0
    return {"model": model, "data": data, "run": run, "out": out, "root": root}


def test_export_writes_a_publishable_folder_that_loads_back(ranked):
    out, run = ranked["out"], ranked["run"]
    names = {p.name for p in out.iterdir()}
    assert {"headset.json", "heads.csv", "manifest.json", "README.md", "duo_attention"} <= names
    assert {"sparsemm_heads.json", "sparsemm_head_score.json"} <= names
    manifest = json.loads((run / "manifest.json").read_text())
    for spec in (out, out / "headset.json", str(out)):
        hs = HeadSet.load(spec)
        table = pd.read_csv(run / "heads.csv")
        pd.testing.assert_frame_equal(hs.heads[table.columns], table, check_dtype=False)
        assert hs.keep == 3 and hs.top() == list(zip(table["layer"][:3], table["head"][:3]))
    ident = checkpoint_identity(ranked["model"])
    assert hs.model == {
        "id": None, "revision": None, "commit": None, "model_type": "qwen2_5_vl",
        "config_hash": ident["digest"], "layers": 2, "heads": 4, "kv_heads": 2, "identity": ident,
    }  # fmt: skip
    assert str(ranked["model"]) not in json.dumps(hs.model)  # the identity holds no path
    prov = hs.provenance
    assert prov["data"] == ranked["data"].name and prov["data_sha256"] == manifest["settings"]["data_sha256"]
    assert (
        prov["query"] == "question" and prov["rule"] == "any" and prov["samples"] == manifest["samples"] == 3
    )
    assert prov["corelens_version"] == corelens.__version__ and prov["manifest"] == manifest
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "data_files: heads.csv" in card and "corelens.headset/1" in card
    # The published set is in the card's table: exactly `keep` rows.
    assert sum(1 for line in card.splitlines() if line.startswith("| ") and line[2].isdigit()) == 3


def test_a_bf16_load_has_the_same_config(ranked):
    hs = HeadSet.load(ranked["out"])
    hs.check(corelens.load(ranked["model"], device="cpu", dtype="bfloat16"))  # dtype is not config


def _hub(home, folder, repo="corelens-test/tiny-heads"):
    """Lay `folder` out as huggingface_hub's cache lays out a dataset: refs/main -> snapshots/<commit>/."""
    base = home / "hub" / ("datasets--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    shutil.copytree(folder, base / "snapshots" / COMMIT)


def test_hub_id_loads_from_the_cache_and_drives_heads(ranked, tmp_path, monkeypatch, capsys):
    _hub(tmp_path / "hf", ranked["out"])
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    local = HeadSet.load(ranked["out"])
    for spec in ("corelens-test/tiny-heads", f"corelens-test/tiny-heads@{COMMIT}"):
        hs = HeadSet.load(spec)
        assert hs.top() == local.top() and hs.model == local.model
    with pytest.raises(CorelensError, match="HF_HUB_OFFLINE is set"):
        HeadSet.load("corelens-test/absent")
    # --heads takes the hub id, the artifact folder and a heads.csv alike.
    common = [
        "--model",
        str(ranked["model"]),
        "--data",
        str(ranked["data"]),
        "--max-new-tokens",
        "2",
        "--limit",
        "1",
    ]
    for i, heads in enumerate(
        ("corelens-test/tiny-heads", str(ranked["out"]), str(ranked["run"] / "heads.csv"))
    ):
        out = tmp_path / f"h{i}"
        args = ["hybrid", *common, "--heads", heads, "--out", str(out), "--keep", "3", "--sets", "top"]
        assert main([*args, "--sink", "1", "--window", "4"]) == 0
        assert pd.read_csv(out / "hybrid.csv")["full_heads"].tolist() == [8, 3]
    out = tmp_path / "ablate"
    args = [
        "ablate",
        *common,
        "--heads",
        "corelens-test/tiny-heads",
        "--out",
        str(out),
        "--k",
        "2",
        "--sets",
        "top",
    ]
    assert main(args) == 0
    assert "identified on the same data" in capsys.readouterr().err  # the manifest travels with the set


def test_another_config_fails_naming_both(ranked, tmp_path, capsys):
    from corelens.models.tiny import build_tiny_checkpoint

    hs = HeadSet.load(ranked["out"])
    other = build_tiny_checkpoint(
        "qwen2_5_vl", tmp_path / "other", words=WORDS, layers=2, heads=4, kv_heads=4
    )
    m = corelens.load(other, device="cpu")
    theirs = m.config_hash()
    with pytest.raises(CorelensError) as err:
        hs.check(m)
    text = str(err.value)
    assert (
        hs.model["config_hash"] in text and theirs in text and "2 KV heads" in text and "4 KV heads" in text
    )
    assert "kv_heads 2 -> 4" in text and "config field text_config.num_key_value_heads: 2 -> 4" in text
    args = ["hybrid", "--model", str(other), "--data", str(ranked["data"]), "--heads", str(ranked["out"]),
            "--out", str(tmp_path / "h"), "--keep", "2", "--sets", "top"]  # fmt: skip
    assert main(args) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("corelens:")]
    assert len(lines) == 1 and hs.model["config_hash"] in lines[0] and theirs in lines[0]


def test_export_errors_are_one_line(ranked, tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "not a rank run" in capsys.readouterr().err
    assert main(["export", str(ranked["run"]), "--out", str(tmp_path / "x"), "--to", "duo"]) == 2
    assert "--n-heads" in capsys.readouterr().err
    assert (
        main(["export", str(ranked["run"]), "--out", str(tmp_path / "x"), "--to", "vllm", "--keep", "2"]) == 2
    )
    assert "unknown format" in capsys.readouterr().err


def _sparsemm_load_head_score(model_type: str) -> dict:
    """SparseMM's loader, as written in gdace829/SparseMM at commit 89221e60d9f97b2ebc1521935e86ae5e447a9da1,
    `sparsemm/sparsemm_utils.py` `load_head_score`: a fixed file relative to the folder it runs in."""
    if "llava" in model_type:
        if "mistral" not in model_type:
            head_score_path = "./visual_head/head_score/llava-v1.6.json"
        else:
            head_score_path = "./visual_head/head_score/llava-mistral-v1.6.json"
    elif "qwen" in model_type:
        head_score_path = "./visual_head/head_score/qwen.json"
    else:  # SparseMM's own answer to another model type, kept as written there
        raise NotImplementedError
    with open(head_score_path) as f:
        return json.load(f)


def test_sparsemm_loader_reads_the_export(ranked, monkeypatch):
    """`export --to sparsemm` writes visual_head/head_score/qwen.json; SparseMM's loader and its per-KV-head
    capacity scores (`SparseMM.__init__`, same file: mean per entry, normalised, summed per KV group) read it."""
    import numpy as np

    hs = HeadSet.load(ranked["out"])
    monkeypatch.chdir(ranked["out"])  # SparseMM runs from its checkout, where visual_head/ is copied
    head_score = _sparsemm_load_head_score(hs.model["model_type"])
    head_score_list = np.array([np.mean(v) for v in head_score.values()])
    head_score_list = head_score_list / head_score_list.sum()
    layers, heads, kv = hs.model["layers"], hs.model["heads"], hs.model["kv_heads"]
    score = head_score_list.reshape(layers, kv, heads // kv).sum(-1)
    mass = hs.heads.set_index(["layer", "head"])["mass"]
    expected = np.array([[mass[(lyr, h)] for h in range(heads)] for lyr in range(layers)])
    np.testing.assert_allclose(score, expected.reshape(layers, kv, -1).sum(-1) / expected.sum(), rtol=1e-6)
    assert json.loads((ranked["out"] / "sparsemm_head_score.json").read_text()) == head_score
