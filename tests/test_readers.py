"""Dataset readers (RefCOCOg, VidSTG, MMLongBench-Doc, MMDocIR) on fixtures written to their schemas."""

from __future__ import annotations

import json

import dataset_fixtures as datasets
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from corelens.cli import main
from corelens.data import load_images, read_samples
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
    assert [s.id.split("-", 2)[2] for s in samples] == ["0-caption-0", "0-question-1"]
    dog = samples[0]
    assert dog.task == "video" and len(dog.video.frames) == 10 and dog.video.fps == 5.0
    tube = dog.targets[0]
    record = json.loads(result.path.read_text().splitlines()[0])
    fids = [record["frame_ids"][k] for k in tube.frames]
    assert fids == [6, 8, 10, 12]  # sampled frames inside temporal_gt [5, 14): end_fid is exclusive
    assert [b[0] for b in tube.boxes] == [2.0 * f for f in fids]  # the dog's box moves with its frame
    brightness = [np.asarray(Image.open(dog.video.frames[k])).mean() for k in range(3)]
    assert brightness == pytest.approx([0, 20, 40], abs=3)  # frame k is video frame 2k


def test_mmlongbench_renders_pages_and_targets_evidence(tmp_path):
    source = datasets.mmlongbench(tmp_path / "mmlb")
    result = convert(f"mmlongbench:{source}", tmp_path / "out", max_side=200)
    samples, _ = read_samples(result.path)
    assert len(samples) == 2  # the unanswerable question is skipped with its reason
    assert (
        result.skipped[0]["sample"] == "mmlongbench-00002" and "not answerable" in result.skipped[0]["reason"]
    )
    total = samples[0]
    assert len(total.images) == 5 and [t.image for t in total.targets] == [1, 3]
    assert total.answer == "42" and total.task == "document"
    assert max(Image.open(total.images[0]).size) == 200
    render = json.loads((tmp_path / "out" / "render.json").read_text())
    assert render["renderer"] == "pypdfium2" and render["max_side"] == 200
    capped = convert(f"mmlongbench:{source}", tmp_path / "cap", max_side=100, max_pages=3)
    first = read_samples(capped.path)[0][0]  # evidence pages 2 and 4: the 3-page window 2-4 holds both
    assert first.meta["pages"] == [2, 3, 4] and [t.image for t in first.targets] == [0, 2]
    assert len(first.images) == 3 and capped.n == 2
    old = convert(f"mmlongbench:{source}", tmp_path / "old", max_side=100, max_pages=3, pages="first")
    assert old.n == 1 and "not among the 3 pages shown" in old.skipped[0]["reason"]


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
    (box,) = chart.targets  # level "auto": the layout box where there is one, Ω recorded per sample
    assert box.image == 1 and box.box == pytest.approx((20.0, 40.0, 80.0, 100.0))  # 800x1000 -> 160x200
    assert chart.meta["omega"] == "layout" and year.meta["omega"] == "page"
    assert year.targets[0].image == 0 and len(year.targets) == 1
    both = read_samples(convert(f"mmdocir:{source}", tmp_path / "both", level="both").path)[0][0]
    assert [t.kind for t in both.targets] == ["image", "box"]
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


# ---------------------------------------------------------------------------------------------------------
# Genuine published records (tests/data/<dataset>/SOURCES) with stand-in media of the recorded sizes.
# Every expected value below is computed from the raw records here, not by the reader's code.


def _clip(box, width, height):
    x0, y0, x1, y1 = box
    out = [min(max(x0, 0), width), min(max(y0, 0), height), min(max(x1, 0), width), min(max(y1, 0), height)]
    return out if out[2] > out[0] and out[3] > out[1] else None


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def vidstg_converted(tmp_path_factory):
    root = datasets.genuine_vidstg(tmp_path_factory.mktemp("vidstg"))
    return root, convert(f"vidstg:{root}", tmp_path_factory.mktemp("vidstg-out"))


def test_vidstg_genuine_entries_every_tube_checked_against_the_record(vidstg_converted):
    root, result = vidstg_converted
    entries = json.loads((datasets.DATA / "vidstg" / "test_annotations.json").read_text())
    samples, skipped = read_samples(result.path)  # the strict reader: duplicate ids would fail here
    records = {r["id"]: r for r in _lines(result.path)}
    assert not skipped and len({s.id for s in samples}) == len(samples)
    expected_ids = []
    for i, e in enumerate(entries):
        width, height = e["width"], e["height"]
        begin, end = e["temporal_gt"]["begin_fid"], e["temporal_gt"]["end_fid"]
        sentences = [("caption", c) for c in e["captions"]] + [("question", q) for q in e["questions"]]
        for s, (kind, item) in enumerate(sentences):
            sid = f"vidstg-{e['vid']}-{i}-{kind}-{s}"
            record = records[sid]
            expected_ids.append(sid)
            ids = record["frame_ids"]
            # Sampled at 2 fps inside the used segment, whose end_fid is exclusive.
            assert all(e["used_segment"]["begin_fid"] <= f < e["used_segment"]["end_fid"] for f in ids)
            assert all(13 <= b - a <= 17 for a, b in zip(ids, ids[1:]))  # 29.97 / 2 frames apart
            want_frames, want_boxes = [], []
            for k, fid in enumerate(ids):
                raw = datasets.vidstg_standin_box(item["target_id"], fid, width, height)
                box = _clip(raw, width, height) if raw else None
                if begin <= fid < end and box is not None:  # temporal_gt: end_fid exclusive
                    want_frames.append(k)
                    want_boxes.append(box)
            tube = record["targets"][0]
            assert tube["frames"] == want_frames
            np.testing.assert_allclose(
                np.asarray(tube["boxes"]).reshape(-1, 4), np.asarray(want_boxes).reshape(-1, 4)
            )
            assert record["question"] == item["description"].strip()
            clipped = {c["fid"] for c in record.get("clipped", [])}
            assert clipped == {ids[k] for k in want_frames if ids[k] % 11 == 8}
    assert sorted(records) == sorted(expected_ids) and result.n == len(expected_ids) == 34
    # An entry whose temporal_gt ends on a sampled frame leaves that frame out (exclusive end).
    entry = next(i for i, e in enumerate(entries) if e["temporal_gt"] == {"begin_fid": 0, "end_fid": 90})
    assert 90 in records[f"vidstg-4488998616-{entry}-caption-0"]["frame_ids"]
    record = records[f"vidstg-4488998616-{entry}-caption-0"]
    assert datasets.vidstg_standin_box(record["target_id"], 90, 640, 360) is not None  # a box on frame 90
    assert max(record["frame_ids"][k] for k in record["targets"][0]["frames"]) == 75


def test_vidstg_frames_that_reach_the_prompt_are_the_recorded_frames(vidstg_converted):
    from corelens.data import load_video

    _, result = vidstg_converted
    samples, _ = read_samples(result.path)
    records = {r["id"]: r for r in _lines(result.path)}
    portrait = next(s for s in samples if records[s.id]["vid"] == "6376025809")
    for sample in (samples[0], portrait):
        frames, _ = load_video(sample)
        assert [datasets.read_index(f) for f in frames] == records[sample.id]["frame_ids"]
    assert portrait.frame_sizes[0] == (640, 1138)


def test_vidstg_sampling_ends_before_end_fid():
    from corelens.data.readers.vidstg import sampled_frames

    assert sampled_frames(0, 30, 30.0, 1.0, 32) == [0]  # frame 30 is past the exclusive end
    assert sampled_frames(0, 31, 30.0, 1.0, 32) == [0, 30]
    assert sampled_frames(10, 12, 10.0, 10.0, 32) == [10, 11]


@pytest.fixture(scope="module")
def mmdocir_converted(tmp_path_factory):
    root = datasets.genuine_mmdocir(tmp_path_factory.mktemp("mmdocir"))
    return root, convert(f"mmdocir:{root}", tmp_path_factory.mktemp("mmdocir-out"))


def test_mmdocir_genuine_lines_every_target_checked_against_the_record(mmdocir_converted):
    root, result = mmdocir_converted
    docs = _lines(datasets.DATA / "mmdocir" / "MMDocIR_annotations.jsonl")
    samples, _ = read_samples(result.path)
    by_id = {s.id: s for s in samples}
    records = {r["id"]: r for r in _lines(result.path)}
    assert result.skipped == [] and len(samples) == sum(len(d["questions"]) for d in docs) == 31
    layout_omega = dropped = clipped = 0
    for line, doc in enumerate(docs, start=1):
        n_pages = doc["page_indices"][1] - doc["page_indices"][0] + 1
        for q, item in enumerate(doc["questions"]):
            sample, record = by_id[f"mmdocir-{line}-{q}"], records[f"mmdocir-{line}-{q}"]
            shown = [p - 1 for p in record["pages"]]
            evidence = set(item["page_id"]) | {m["page"] for m in item["layout_mapping"]}
            assert len(shown) == min(n_pages, 64) and evidence <= set(shown)
            images = load_images(sample)
            assert [datasets.read_index(im) for im in images] == shown  # the pages that reach the prompt
            want = []
            for m in item["layout_mapping"]:
                pw, ph = m["page_size"]
                box = _clip(m["bbox"], pw, ph)
                if box is None:
                    dropped += 1
                    continue
                clipped += box != m["bbox"]
                width, height = images[shown.index(m["page"])].size
                sx, sy = width / pw, height / ph
                want.append((shown.index(m["page"]), (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)))
            if want:
                layout_omega += 1
                assert record["omega"] == "layout"
                assert [(t.image, t.box) for t in sample.targets] == [(k, pytest.approx(b)) for k, b in want]
            else:
                assert record["omega"] == "page"
                assert sorted(shown[t.image] for t in sample.targets) == sorted(item["page_id"])
    # Every question here has layout evidence; one has only the zero-width box, so its Ω falls back to its page.
    assert layout_omega == 30 and dropped == 1 and clipped == 3
    assert [i for i, r in records.items() if r["omega"] == "page"] == ["mmdocir-6-2"]
    assert sum(len(r.get("dropped_boxes", [])) for r in records.values()) == dropped
    assert sum(len(r.get("clipped", [])) for r in records.values()) == clipped


def test_mmdocir_levels_and_page_modes_on_the_genuine_lines(mmdocir_converted, tmp_path):
    root, result = mmdocir_converted
    pages = convert(f"mmdocir:{root}", tmp_path / "page", level="page")
    assert all(t.kind == "image" for s in read_samples(pages.path)[0] for t in s.targets)
    both = {
        s.id: s for s in read_samples(convert(f"mmdocir:{root}", tmp_path / "both", level="both").path)[0]
    }
    auto = {s.id: s for s in read_samples(result.path)[0]}
    for i, sample in auto.items():
        kinds = {"image", "box"} if any(t.kind == "box" for t in sample.targets) else {"image"}
        assert {t.kind for t in both[i].targets} == kinds
    # The old behaviour, the first 64 pages, skips the questions whose evidence lies beyond, with the reason.
    first = convert(f"mmdocir:{root}", tmp_path / "first", pages="first")
    docs = _lines(datasets.DATA / "mmdocir" / "MMDocIR_annotations.jsonl")
    beyond = [
        f"mmdocir-{line}-{q}"
        for line, d in enumerate(docs, start=1)
        for q, item in enumerate(d["questions"])
        if max(set(item["page_id"]) | {m["page"] for m in item["layout_mapping"]}) >= 64
    ]
    assert sorted(r["sample"] for r in first.skipped) == sorted(beyond) and len(beyond) == 6
    assert all("not among the 64 pages shown" in r["reason"] for r in first.skipped)
    logged = _lines(tmp_path / "first" / "skipped.jsonl")
    assert [r["sample"] for r in logged] == [r["sample"] for r in first.skipped]


@pytest.fixture(scope="module")
def mmlongbench_converted(tmp_path_factory):
    root = datasets.genuine_mmlongbench(tmp_path_factory.mktemp("mmlb"))
    return root, convert(f"mmlongbench:{root}", tmp_path_factory.mktemp("mmlb-out"), max_side=64)


def test_mmlongbench_genuine_questions_every_target_checked_against_the_record(mmlongbench_converted):
    root, result = mmlongbench_converted
    items = json.loads((datasets.DATA / "mmlongbench" / "samples.json").read_text())
    pages_of = {
        k: len(v)
        for k, v in json.loads((datasets.DATA / "mmlongbench" / "documents.json").read_text()).items()
    }
    samples, _ = read_samples(result.path)
    by_id = {s.id: s for s in samples}
    records = {r["id"]: r for r in _lines(result.path)}
    unanswerable = [f"mmlongbench-{i:05d}" for i, x in enumerate(items) if x["answer"] == "Not answerable"]
    assert sorted(r["sample"] for r in result.skipped) == unanswerable and len(unanswerable) == 4
    assert all(r["reason"].startswith("not answerable") for r in result.skipped)
    assert len(samples) == len(items) - 4 == 16
    for i, item in enumerate(items):
        sid = f"mmlongbench-{i:05d}"
        if sid in unanswerable:
            continue
        sample, record = by_id[sid], records[sid]
        evidence = json.loads(item["evidence_pages"])
        shown = record["pages"]  # 1-based page numbers
        assert len(shown) == min(pages_of[item["doc_id"]], 64) and set(evidence) <= set(shown)
        images = load_images(sample)
        assert [datasets.read_index(im) + 1 for im in images] == shown  # the pages that reach the prompt
        assert sorted(shown[t.image] for t in sample.targets) == sorted(evidence)
        assert sample.answer == item["answer"]
    # The answerable question with "[]" evidence is kept, without a target, for the scoring commands.
    assert by_id["mmlongbench-00016"].targets == () and by_id["mmlongbench-00016"].answer == "0"
    # Evidence on pages 66-68 of the 76-page document: a 64-page window that holds them.
    assert records["mmlongbench-00009"]["pages"] == list(range(13, 77))
    wide = next(s for s in samples if records[s.id]["doc_id"] == "2024.ug.eprospectus.pdf")
    sizes = {Image.open(p).size for p in wide.images}  # A4 portrait pages and double-page spreads
    assert {max(size) for size in sizes} == {64} and {size[0] > size[1] for size in sizes} == {True, False}
    assert {min(size) for size in sizes} <= {45, 46}  # 64 * 595.28 / 841.89 = 45.3


def test_mmlongbench_options_on_the_genuine_questions(mmlongbench_converted, tmp_path):
    root, _ = mmlongbench_converted
    keep = convert(f"mmlongbench:{root}", tmp_path / "keep", max_side=32, keep_unanswerable=True)
    assert keep.n == 20 and keep.skipped == []
    first = convert(f"mmlongbench:{root}", tmp_path / "first", max_side=32, pages="first")
    assert [r["sample"] for r in first.skipped if "not among" in r["reason"]] == ["mmlongbench-00009"]
    everything = convert(f"mmlongbench:{root}", tmp_path / "all", max_side=32, pages="all")
    assert max(len(s.images) for s in read_samples(everything.path)[0]) == 76
    with pytest.raises(InputError, match="pages must be one of"):
        convert(f"mmlongbench:{root}", tmp_path / "bad", pages="middle")


def test_page_window_keeps_every_evidence_page():
    from corelens.data.readers.common import page_window

    assert page_window(76, [65, 66, 67], 64, "window") == list(range(12, 76))
    assert page_window(200, [100], 10, "window") == list(range(96, 106))
    spread = page_window(200, [0, 150, 199], 6, "window")
    assert len(spread) == 6 and {0, 150, 199} <= set(spread)
    assert page_window(10, [9], 4, "first") == [0, 1, 2, 3] and page_window(10, [9], 4, "all") == list(
        range(10)
    )
    with pytest.raises(ValueError, match="more than max_pages"):
        page_window(200, [1, 2, 3], 2, "window")


@pytest.fixture(scope="module")
def refcocog_converted(tmp_path_factory):
    root, standins = datasets.genuine_refcocog(tmp_path_factory.mktemp("refcocog"))
    return root, standins, convert(f"refcocog:{root}", tmp_path_factory.mktemp("refcocog-out"))


def test_refcocog_genuine_refs_every_box_checked_against_the_record(refcocog_converted):
    import csv

    root, standins, result = refcocog_converted
    with open(datasets.DATA / "refcocog" / "refcocog_umd_val.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    samples, _ = read_samples(result.path)
    by_id = {s.id: s for s in samples}
    kept = 0
    for row in rows:
        ref_id = int(row["ref_id"])
        _, (x, y, w, h) = standins["boxes"][ref_id]
        width, height = standins["sizes"][int(row["img_id"])]
        box = _clip([x, y, x + w, y + h], width, height)  # COCO [x, y, w, h] -> [x0, y0, x1, y1], clipped
        sid = f"refcocog-{ref_id}-{row['sent_id']}"
        if box is None:
            assert sid not in by_id
            continue
        kept += 1
        sample = by_id[sid]
        assert sample.question == row["sent"] and sample.targets[0].box == pytest.approx(box)
        assert sample.images[0].name == f"COCO_train2014_{int(row['img_id']):012d}.jpg"
    published = by_id["refcocog-999999-999999"]
    assert published.targets[0].box == pytest.approx((263.87, 216.88, 285.0, 232.05))
    assert published.image_sizes[0] == (640, 424)
    assert result.n == kept + 1 == 23
    assert [r["sample"] for r in result.skipped] == ["5107"] and "empty once clipped" in result.skipped[0][
        "reason"
    ]
    clipped = [s for s in samples if "clipped" in s.meta["meta"]]
    assert {s.id.split("-")[1] for s in clipped} == {"5105"}


def test_refcocog_refs_pickle_read_by_the_restricted_unpickler(refcocog_converted):
    import pickle

    from corelens.data.readers.refcocog import load_refs

    root, _, _ = refcocog_converted
    path = root / "refs(umd).p"
    assert load_refs(path) == pickle.loads(path.read_bytes())  # plain data reads the same
    assert load_refs(path)[0]["sentences"][0]["sent"] == "a bush of plant behind middle woman"


class _Payload:
    """Unpickling this calls exec: it writes the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_refcocog_malicious_refs_pickle_is_refused_and_nothing_runs(tmp_path, protocol, capsys):
    import pickle

    marker = tmp_path / "ran.txt"
    hostile = pickle.dumps([{"ref_id": 1, "sentences": [_Payload(marker)]}], protocol=protocol)
    pickle.loads(hostile)  # control: a plain pickle.loads does run the payload
    assert marker.is_file()
    marker.unlink()
    source = datasets.refcocog_release(tmp_path / "refcocog")
    (source / "refs(umd).p").write_bytes(hostile)
    with pytest.raises(InputError, match=r"refs\(umd\)\.p: cannot read the refs pickle.*builtin.*exec"):
        convert(f"refcocog:{source}", tmp_path / "out")
    assert not marker.exists()
    assert main(["data", "convert", f"refcocog:{source}", "--out", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert "only plain data is allowed" in err and "Traceback" not in err and not marker.exists()


def _subset(result, out, ids=None, n=2):
    """A small sample file of the converted records (the first `n`, plus `ids`), for the rank runs."""
    lines = [line for line in result.path.read_text().splitlines() if line.strip()]
    keep = lines[:n] + [line for line in lines[n:] if json.loads(line)["id"] in (ids or [])]
    out.write_text("\n".join(keep) + "\n")
    return out, [json.loads(line) for line in keep]


@pytest.mark.e2e  # a whole workflow: a converted dataset ranked by the `rank` command
@pytest.mark.parametrize("dataset", ["vidstg", "mmdocir", "mmlongbench", "refcocog"])
def test_rank_runs_end_to_end_on_each_converted_genuine_dataset(dataset, request, tiny_dir, tmp_path):
    converted = request.getfixturevalue(f"{dataset}_converted")
    extra = ["mmlongbench-00016"] if dataset == "mmlongbench" else []  # evidence "[]": no Ω
    data, records = _subset(converted[-1], tmp_path / "subset.jsonl", extra)
    model = tiny_dir("qwen2_5_vl", layers=1)
    out = tmp_path / "run"
    assert (
        main(["rank", "--model", str(model), "--data", str(data), "--out", str(out), "--overlays", "0"]) == 0
    )
    ram = pd.read_parquet(out / "ram.parquet")
    assert sorted(ram["sample_id"].unique()) == sorted(r["id"] for r in records if r.get("targets"))
    assert (ram["n_omega"] > 0).all() and (ram["n_omega"] <= ram["n_visual"]).all()
    logged = _lines(out / "samples.jsonl")
    skipped = [r for r in logged if r["status"] == "skipped"]
    assert [r["id"] for r in skipped] == extra
    assert all(r["reason"] == "no evidence target: RAM needs Ω" for r in skipped)


def test_data_stats_on_a_conversion_and_on_a_run(mmlongbench_converted, tiny_dir, tmp_path, capsys):
    _, result = mmlongbench_converted
    assert main(["data", "stats", str(result.path.parent), "--out", str(tmp_path / "conv.json")]) == 0
    printed = capsys.readouterr().out
    stats = json.loads((tmp_path / "conv.json").read_text())["datasets"]["mmlongbench"]
    assert stats["samples"] == 16 and stats["without_target"] == 1 and stats["skipped"] == 4
    assert stats["skipped_reasons"] == {"not answerable: no evidence page and no answer": 4}
    assert stats["pages_per_sample"]["max"] == 64 and stats["pages_per_sample"]["min"] == 27
    assert "mmlongbench: 16 samples (1 without a target), 4 skipped" in printed
    # On a rank run, with the model: tokens through the processor alone, Ω share as the run measured it.
    data, records = _subset(result, tmp_path / "subset.jsonl", ["mmlongbench-00016"])
    model = tiny_dir("qwen2_5_vl", layers=1)
    run = tmp_path / "run"
    assert (
        main(["rank", "--model", str(model), "--data", str(data), "--out", str(run), "--overlays", "0"]) == 0
    )
    assert main(["data", "stats", str(run), "--model", str(model)]) == 0
    written = json.loads((run / "data_stats.json").read_text())
    entry = written["datasets"]["mmlongbench"]
    assert entry["samples"] == 3 and entry["skipped_reasons"] == {"no evidence target: RAM needs Ω": 1}
    ram = pd.read_parquet(run / "ram.parquet").drop_duplicates("sample_id").set_index("sample_id")
    for row in written["samples"]:
        if row["targets"]:
            assert row["omega_tokens"] == ram.loc[row["id"], "n_omega"]
            assert row["visual_tokens"] == ram.loc[row["id"], "n_visual"]
            assert row["omega_share"] == pytest.approx(row["omega_tokens"] / row["visual_tokens"])
        assert row["prompt_tokens"] > row["visual_tokens"] > 0
    assert entry["prompt_tokens"]["total"] == sum(r["prompt_tokens"] for r in written["samples"])
    # Knocking out Ω needs Ω: ablate skips the question without a target, with the reason, and scores the rest.
    argv = ["ablate", "--model", str(model), "--data", str(data), "--heads", str(run / "heads.csv")]
    argv += [
        "--out",
        str(tmp_path / "ab"),
        "--k",
        "1",
        "--sets",
        "top",
        "--op",
        "knockout",
        "--keys",
        "omega",
    ]
    assert main(argv + ["--max-new-tokens", "2"]) == 0
    ablated = _lines(tmp_path / "ab" / "samples.jsonl")
    assert [r["id"] for r in ablated if r["status"] == "skipped"] == ["skipped|mmlongbench-00016"]
    assert [r["reason"] for r in ablated if r["status"] == "skipped"] == [
        "no evidence target: knocking out Ω needs one"
    ]
    scored = {r["id"].split("|")[-1] for r in ablated if r["status"] == "ok"}
    assert scored == {r["id"] for r in records if r.get("targets")}
    assert main(["data", "stats", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
