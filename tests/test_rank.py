"""`corelens rank`: outputs, resumability, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from corelens.cli import main
from corelens.organism.tasks import WORDS, generate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from corelens.models.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("rank")
    model = build_tiny_checkpoint("qwen2_5_vl", root / "model", words=WORDS, layers=2, heads=4, kv_heads=2)
    data = generate("image", root / "data", 6, seed=3)
    return model, data


def _rank(model, data, out, *extra) -> int:
    return main(["rank", "--model", str(model), "--data", str(data), "--out", str(out), *extra])


def test_rank_writes_tables_figure_and_manifest(setup, tmp_path):
    model, data = setup
    out = tmp_path / "run"
    assert _rank(model, data, out) == 0
    heads = pd.read_csv(out / "heads.csv")
    assert list(heads.columns[:7]) == ["layer", "head", "mass", "share", "lift", "n", "rank"]
    assert len(heads) == 8 and sorted(heads["rank"]) == list(range(1, 9))
    assert heads["mass"].is_monotonic_decreasing and (heads["n"] == 6).all()
    ram = pd.read_parquet(out / "ram.parquet")
    assert {"sample_id", "layer", "head", "mass", "share", "lift"} <= set(ram.columns)
    assert len(ram) == 6 * 8 and ram["sample_id"].nunique() == 6
    assert ((ram["mass"] >= 0) & (ram["mass"] <= ram["mass"] / ram["share"] + 1e-9)).all()
    means = ram.groupby(["layer", "head"])["mass"].mean()
    top = heads.iloc[0]
    assert means[(top["layer"], top["head"])] == pytest.approx(top["mass"], abs=1e-12)
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("argv", "settings", "versions", "machine", "started", "finished", "timings"):
        assert key in manifest
    assert manifest["settings"]["data_sha256"] and manifest["settings"]["model_config_hash"]
    assert (out / "figures" / "heads_mass.png").stat().st_size > 1000


@pytest.mark.e2e
def test_rank_resumes_after_kill_with_identical_heads(setup, tmp_path):
    model, _ = setup
    # 60 samples, so that the kill lands part-way however fast this machine ranks them (6 once finished
    # before a 50 ms poll saw the second line).
    data = generate("image", tmp_path / "data", 60, seed=3)
    full = tmp_path / "full"
    assert _rank(model, data, full) == 0
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "corelens.cli", "rank", "--model", str(model), "--data", str(data)]
    proc = subprocess.Popen([*cmd, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or log.read_text().count("\n") < 2):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = log.read_text().count("\n")
    assert 2 <= finished < 60, "the run should have been killed part-way"
    with open(log, "a") as f:
        f.write('{"id": "image-0000')  # a line torn by the kill
    assert _rank(model, data, out) == 0
    assert (out / "heads.csv").read_bytes() == (full / "heads.csv").read_bytes()
    ids = [json.loads(line)["id"] for line in log.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 60  # finished samples were not redone
    assert json.loads((out / "manifest.json").read_text())["resumed"] == 1


def test_rank_refuses_to_resume_with_other_settings(setup, tmp_path, capsys):
    model, data = setup
    out = tmp_path / "run"
    assert _rank(model, data, out, "--limit", "1") == 0
    assert _rank(model, data, out, "--limit", "1", "--query", "last") == 2
    assert "other settings (query)" in capsys.readouterr().err


def _bad_data(data: Path, tmp_path: Path) -> Path:
    lines = data.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["targets"][0]["box"] = [10, 10, 5000, 20]  # outside the image
    lines[1] = json.dumps(bad)
    out = data.parent / "bad.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_bad_sample_stops_with_file_line_and_field(setup, tmp_path, capsys):
    model, data = setup
    bad = _bad_data(data, tmp_path)
    assert _rank(model, bad, tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "targets[0].box" in err and "image-00001" in err
    assert "Traceback" not in err


def test_skip_bad_logs_and_continues(setup, tmp_path):
    model, data = setup
    bad = _bad_data(data, tmp_path)
    out = tmp_path / "run"
    assert _rank(model, bad, out, "--skip-bad") == 0
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    skipped = [r for r in records if r["status"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["line"] == 2 and "targets[0].box" in skipped[0]["error"]
    assert pd.read_parquet(out / "ram.parquet")["sample_id"].nunique() == 5
    assert json.loads((out / "manifest.json").read_text())["skipped"] == 1


def test_missing_data_file_is_a_clear_error(setup, tmp_path, capsys):
    model, _ = setup
    assert _rank(model, tmp_path / "nope.jsonl", tmp_path / "run") == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_ram_per_view_on_internvl_tiles(tiny_dir, tmp_path):
    """ram.parquet's per-view masses against eager attention, views and Ω read from the token ids."""
    import numpy as np
    import torch
    from helpers import noise_image

    import corelens
    from corelens.data.sample import Sample, Target
    from corelens.experiments.rank import rank
    from corelens.models.tiny import load_tiny

    path = tiny_dir("internvl")
    wide, square = tmp_path / "wide.png", tmp_path / "square.png"
    noise_image(224, 112, seed=1).save(wide)  # two 112 px tiles side by side, plus a thumbnail
    noise_image(100, 100, seed=2).save(square)  # one tile
    box = Target("box", image=0, box=(0.0, 0.0, 112.0, 112.0))  # exactly the left tile
    sample = Sample(
        "v", "image", "what is the colour of the cup ?", images=(wide, square),
        image_sizes=((224, 112), (100, 100)), targets=(box,), answer="red",
    )  # fmt: skip
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(sample.to_json(tmp_path)) + "\n")
    ranking = rank(corelens.load(path), data, query="last", out=tmp_path / "run")

    # Independent: the tiles are runs of 16 image-context ids (4 x 4 cells) in the processor's order.
    m = corelens.load(path)
    inputs = corelens.prepare(m, corelens.read_samples(data)[0][0]).inputs
    ids = inputs["input_ids"][0].numpy()
    context = np.flatnonzero(ids == m.processor.image_token_id)
    assert len(context) == 4 * 16
    tiles = context.reshape(4, 16)  # left tile, right tile, thumbnail of image 0; image 1
    # Ω: the whole left tile, and in the 4 x 4 thumbnail (56 x 28 px cells) the two left columns.
    omega = np.concatenate([tiles[0], tiles[2].reshape(4, 4)[:, :2].ravel()])
    eager, _ = load_tiny(path, attn_implementation="eager")
    with torch.no_grad():
        att = eager(**inputs, output_attentions=True, use_cache=False).attentions
    last = np.stack([a[0, :, -1].double().numpy() for a in att])  # (layers, heads, keys)

    frame = pd.read_parquet(tmp_path / "run" / "ram.parquet")
    assert len(frame) == len(ranking.ram) == 2 * 4
    for row in frame.itertuples():
        views = list(row.views)
        assert [v["view"] for v in views] == [
            "image 0:tile 0,0", "image 0:tile 0,1", "image 0:thumbnail", "image 1"
        ]  # fmt: skip
        assert [v["tokens"] for v in views] == [16] * 4 and [v["omega_tokens"] for v in views] == [
            16,
            0,
            8,
            0,
        ]
        a = last[row.layer, row.head]
        for view, tokens in zip(views, tiles):
            inside = np.intersect1d(tokens, omega)
            assert view["mass"] == pytest.approx(a[tokens].sum(), rel=1e-5, abs=1e-9)
            assert view["omega_mass"] == pytest.approx(a[inside].sum(), rel=1e-5, abs=1e-9)
            assert view["omega_share"] == pytest.approx(a[inside].sum() / a[tokens].sum(), rel=1e-5)
        assert sum(v["omega_mass"] for v in views) == pytest.approx(row.mass, rel=1e-5)
