"""Model identity without the path (corelens.runs.identity): one checkpoint reached through a relative path, an
absolute path, a symlink, a copy and two hub caches is one model for head sets and resumed runs; one changed
config field or tensor shape is another model, and the refusal names it."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

import corelens
from corelens.cli import main
from corelens.errors import CorelensError
from corelens.heads import HeadSet
from corelens.heads.artifact import config_hash
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.runs import identity

REPO = "org/organism"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TENSOR = "model.layers.0.mlp.down_proj.weight"


def _hub(home, blobs: bool):
    """Lay the organism out as huggingface_hub's cache does under `home`: refs/main -> snapshots/COMMIT/, its
    files copied there or (`blobs`) links into blobs/ as a download leaves them."""
    base = home / "hub" / ("models--" + REPO.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    snapshot = base / "snapshots" / COMMIT
    if not blobs:
        shutil.copytree(organism_path(), snapshot)
        return
    (base / "blobs").mkdir()
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(organism_path().iterdir())):
        shutil.copy(f, base / "blobs" / f"blob{i}")
        (snapshot / f.name).symlink_to(f"../../blobs/blob{i}")


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """The organism in every place (copy, symlink, two hub caches), a rank run on it and its exported head set."""
    root = tmp_path_factory.mktemp("identity")
    copy = root / "copy"
    shutil.copytree(organism_path(), copy)
    (root / "link").symlink_to(organism_path(), target_is_directory=True)
    _hub(root / "hfA", blobs=False)
    _hub(root / "hfB", blobs=True)
    data = generate("image", root / "data", 2, seed=3)
    run = root / "rank"
    corelens.rank(corelens.load(organism_path(), device="cpu"), data, query="answer", out=run)
    HeadSet.from_run(run, keep=3).save(root / "headset")
    return {"root": root, "copy": copy, "data": data, "run": run, "headset": root / "headset"}


def _places(setting, monkeypatch):
    """Yield (name, spec) for each way to the organism; a hub id's cache is set in the environment first."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(organism_path().parent)
    yield "relative", "checkpoint"
    yield "absolute", str(organism_path())
    yield "symlink", str(setting["root"] / "link")
    yield "copy", str(setting["copy"])
    for cache in ("hfA", "hfB"):
        monkeypatch.setenv("HF_HOME", str(setting["root"] / cache))
        yield cache, REPO


def test_one_checkpoint_in_every_place_is_one_model(setting, monkeypatch):
    hs = HeadSet.load(setting["headset"] / "headset.json")
    digests = {}
    for name, spec in _places(setting, monkeypatch):
        m = corelens.load(spec, device="cpu")
        hs.check(m)  # the loaded model
        hs.check(spec)  # the checkpoint, read without its weights
        ident = m.identity()
        digests[name] = ident["digest"]
        assert str(m.path) not in json.dumps(ident) and "_name_or_path" not in ident["config"]
        if name.startswith("hf"):
            assert (ident["id"], ident["commit"]) == (REPO, COMMIT)
    assert set(digests.values()) == {hs.model["config_hash"]}, digests
    # A bf16 load of the same files is the same model (the stored dtypes are in the headers).
    hs.check(corelens.load(setting["copy"], device="cpu", dtype="bfloat16"))


def test_ablate_takes_the_exported_headset_through_a_copy(setting, tmp_path, capsys):
    args = ["ablate", "--model", str(setting["copy"]), "--data", str(setting["data"]), "--heads",
            str(setting["headset"] / "headset.json"), "--out", str(tmp_path / "a"), "--k", "2",
            "--sets", "top", "--limit", "1", "--max-new-tokens", "2"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err


def test_rank_resumes_wherever_the_model_is(setting, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    common = ["--data", str(setting["data"]), "--out", str(out), "--overlays", "0", "--query", "answer"]
    for i, (name, spec) in enumerate(_places(setting, monkeypatch)):
        assert main(["rank", "--model", spec, *common]) == 0, (name, capsys.readouterr().err)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["resumed"] == i, name
        # The manifest says where the model is now; the identity digest never changed.
        assert manifest["settings"]["model_id"] == (REPO if name.startswith("hf") else None)
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 2  # every sample measured once, by the first run


def _changed_config(setting, tmp_path):
    folder = tmp_path / "changed"
    shutil.copytree(setting["copy"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["rms_norm_eps"] = 1e-6
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_changed_config_field_is_refused_naming_it(setting, tmp_path, capsys):
    folder = _changed_config(setting, tmp_path)
    hs = HeadSet.load(setting["headset"])
    with pytest.raises(CorelensError) as err:
        hs.check(corelens.load(folder, device="cpu"))
    text = str(err.value)
    assert "config field text_config.rms_norm_eps: 1e-05 -> 1e-06" in text and "tensor" not in text
    assert hs.model["config_hash"] in text and identity.describe(hs.model["identity"]) in text
    # The resume check names it as well, in one line.
    out = tmp_path / "run"
    shutil.copytree(setting["run"], out)
    args = [
        "rank",
        "--model",
        str(folder),
        "--data",
        str(setting["data"]),
        "--out",
        str(out),
        "--query",
        "answer",
    ]
    assert main(args) == 2
    err_lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("corelens:")]
    assert len(err_lines) == 1 and "other settings (model_config_hash)" in err_lines[0]
    assert "config field text_config.rms_norm_eps: 1e-05 -> 1e-06" in err_lines[0]


def test_a_changed_tensor_shape_is_refused_naming_it(setting, tmp_path):
    folder = tmp_path / "reshaped"
    shutil.copytree(setting["copy"], folder)
    tensors = load_file(folder / "model.safetensors")
    tensors[TENSOR] = tensors[TENSOR][:, :-1].contiguous()  # [128, 384] -> [128, 383]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CorelensError) as err:
        HeadSet.load(setting["headset"]).check(folder)
    text = str(err.value)
    assert f'tensor {TENSOR}: "F32[128, 384]" -> "F32[128, 383]"' in text and "config field" not in text


def test_weights_without_headers_are_identified_by_size_and_hash(tmp_path):
    shutil.copy(organism_path() / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"weights")
    a = identity.weights_of_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"weightz")
    b = identity.weights_of_folder(tmp_path)
    assert list(a["files"]) == ["pytorch_model.bin"] and a["files"]["pytorch_model.bin"].startswith("7 ")
    config = json.loads((tmp_path / "config.json").read_text())
    diff = identity.differences(identity.record(config, a), identity.record(config, b))
    assert len(diff) == 1 and diff[0].startswith("weight file pytorch_model.bin: ")


def test_an_old_head_set_and_an_old_run_still_read(setting, tmp_path, capsys):
    """Written before identities: a config hash that held the path, no `identity` / `model_identity`."""
    old = HeadSet.load(setting["headset"])
    m = corelens.load(setting["copy"], device="cpu")
    for legacy_hash in (config_hash(m.model.config), "10b8b7689652ea4e"):  # made on this folder, elsewhere
        model = {k: v for k, v in old.model.items() if k != "identity"} | {"config_hash": legacy_hash}
        HeadSet(model, old.heads, old.keep).check(m)  # accepted: layers and heads agree
        noted = "written by an earlier corelens" in capsys.readouterr().err
        assert noted == (legacy_hash == "10b8b7689652ea4e")
    out = tmp_path / "run"
    shutil.copytree(setting["run"], out)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["settings"]["model_identity"]
    manifest["settings"]["model_config_hash"] = "10b8b7689652ea4e"
    (out / "manifest.json").write_text(json.dumps(manifest))
    args = ["rank", "--data", str(setting["data"]), "--out", str(out), "--query", "answer", "--model"]
    assert main([*args, str(setting["copy"])]) == 2  # another folder: cannot be told apart, refused
    assert "resume it with that --model folder" in capsys.readouterr().err
    assert main([*args, str(organism_path())]) == 0  # the folder it was started on
    assert "path-dependent config hash" in capsys.readouterr().err
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    assert settings["model_config_hash"] == m.config_hash() and "model_identity" in settings
