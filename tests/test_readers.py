"""Dataset readers (RefCOCOg, VidSTG, MMLongBench-Doc, MMDocIR) on fixtures written to their schemas."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from corelens.cli import main
from corelens.data import read_samples
from corelens.data.readers import convert, resolve
from corelens.errors import InputError


def test_refcocog_release_one_sample_per_expression(tmp_path):
    source = datasets.refcocog_release(tmp_path / "refcocog")
    result = convert(f"refcocog:{source}", tmp_path / "out")  # split "val" by default
    samples, _ = read_samples(result.path)
    assert [s.id for s in samples] == ["refcocog-100-1", "refcocog-100-2"]
    assert samples[0].question == "the cup on the left" and samples[0].task == "image"
    assert samples[0].targets[0].box == (20.0, 30.0, 70.0, 70.0)  # COCO [x, y, w, h] -> [x0, y0, x1, y1]
    assert samples[0].images[0].name == "COCO_train2014_000000000001.jpg"
    every = convert(f"refcocog:{source}", tmp_path / "all", split=None)
    assert every.n == 3


def test_refcocog_parquet_layout(tmp_path):
    path = datasets.refcocog_parquet(tmp_path / "hub")
    result = convert(f"refcocog:{path}", tmp_path / "out", template="Find {expression}.")
    samples, _ = read_samples(result.path)
    assert [s.question for s in samples] == ["Find the dog.", "Find a brown dog.", "Find the chair."]
    assert samples[0].targets[0].box == (5.0, 6.0, 25.0, 36.0)
    assert Image.open(samples[2].images[0]).size == (90, 90)


def test_refcocog_bad_record_names_file_and_record_or_is_skipped(tmp_path):
    source = datasets.refcocog_release(tmp_path / "refcocog", bad=True)
    with pytest.raises(InputError) as err:
        convert(f"refcocog:{source}", tmp_path / "out")
    assert "refs(umd).p:3" in str(err.value) and "'102'" in str(err.value) and "ann_id" in str(err.value)
    result = convert(f"refcocog:{source}", tmp_path / "skip", skip_bad=True)
    assert result.n == 2 and len(result.skipped) == 1
    logged = [json.loads(line) for line in (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()]
    assert logged[0]["sample"] == "102" and "ann_id" in logged[0]["error"]


@pytest.mark.parametrize("as_video", [True, False])
def test_vidstg_tubes_follow_the_trajectories(tmp_path, as_video):
    source = datasets.vidstg(tmp_path / "vidstg", as_video=as_video)
    result = convert(f"vidstg:{source}", tmp_path / "out", fps=5.0)  # native 10 fps -> every 2nd frame
    samples, _ = read_samples(result.path)
    assert [s.id.split("-", 2)[2] for s in samples] == ["caption-0", "question-1"]
    dog = samples[0]
    assert dog.task == "video" and len(dog.video.frames) == 10 and dog.video.fps == 5.0
    tube = dog.targets[0]
    record = json.loads(result.path.read_text().splitlines()[0])
    fids = [record["frame_ids"][k] for k in tube.frames]
    assert fids == [6, 8, 10, 12, 14]  # sampled frames inside temporal_gt [5, 14]
    assert [b[0] for b in tube.boxes] == [2.0 * f for f in fids]  # the dog's box moves with its frame
    brightness = [np.asarray(Image.open(dog.video.frames[k])).mean() for k in range(3)]
    assert brightness == pytest.approx([0, 20, 40], abs=3)  # frame k is video frame 2k


def test_mmlongbench_renders_pages_and_targets_evidence(tmp_path):
    source = datasets.mmlongbench(tmp_path / "mmlb")
    result = convert(f"mmlongbench:{source}", tmp_path / "out", max_side=200)
    samples, _ = read_samples(result.path)
    assert len(samples) == 2  # the unanswerable question has no evidence
    total = samples[0]
    assert len(total.images) == 5 and [t.image for t in total.targets] == [1, 3]
    assert total.answer == "42" and total.task == "document"
    assert max(Image.open(total.images[0]).size) == 200
    render = json.loads((tmp_path / "out" / "render.json").read_text())
    assert render["renderer"] == "pypdfium2" and render["max_side"] == 200
    capped = convert(f"mmlongbench:{source}", tmp_path / "cap", max_side=100, max_pages=3, skip_bad=True)
    assert capped.n == 1 and "beyond the 3 pages" in capped.skipped[0]["error"]


def test_mmlongbench_missing_document_is_named(tmp_path):
    source = datasets.mmlongbench(tmp_path / "mmlb", bad=True)
    with pytest.raises(InputError, match=r"samples.json:4.*doc_id.*missing.pdf"):
        convert(f"mmlongbench:{source}", tmp_path / "out", max_side=100)


def test_mmdocir_page_and_layout_targets(tmp_path):
    source = datasets.mmdocir(tmp_path / "mmdocir")
    result = convert(f"mmdocir:{source}", tmp_path / "out")
    samples, _ = read_samples(result.path)
    chart, year = samples
    assert len(chart.images) == 3 and len(year.images) == 2
    assert chart.targets[0].kind == "image" and chart.targets[0].image == 1
    box = chart.targets[1]
    assert box.image == 1 and box.box == pytest.approx((20.0, 40.0, 80.0, 100.0))  # 800x1000 -> 160x200
    assert year.targets[0].image == 0 and len(year.targets) == 1
    pages = convert(f"mmdocir:{source}", tmp_path / "pages", level="page")
    assert all(t.kind == "image" for s in read_samples(pages.path)[0] for t in s.targets)
    stored = pd.read_parquet(source / "MMDocIR_pages.parquet")
    assert len(stored) == 5


def test_data_spec_on_any_command_converts_once_into_the_cache(tmp_path, monkeypatch, capsys):
    from corelens.models.tiny import build_tiny_checkpoint

    monkeypatch.setenv("CORELENS_CACHE", str(tmp_path / "cache"))
    source = datasets.refcocog_release(tmp_path / "refcocog")
    model = build_tiny_checkpoint("qwen2_5_vl", tmp_path / "m", words=["cup"], layers=1)
    out = tmp_path / "run"
    argv = [
        "rank",
        "--model",
        str(model),
        "--data",
        f"refcocog:{source}",
        "--out",
        str(out),
        "--overlays",
        "0",
    ]
    assert main(argv) == 0
    assert pd.read_parquet(out / "ram.parquet")["sample_id"].nunique() == 2
    first = resolve(f"refcocog:{source}")
    assert first.is_file() and str(first).startswith(str(tmp_path / "cache"))
    assert resolve(f"refcocog:{source}") == first  # cached: converted once
    assert main(["data", "convert", f"mmdocir:{tmp_path / 'nowhere'}", "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
