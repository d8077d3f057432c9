"""Tests of the sample file reader, writer and loaders (corelens.data)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from corelens.data import (
    Sample,
    SkippedSample,
    Target,
    Video,
    load_images,
    load_video,
    read_samples,
    sample_times,
    write_samples,
)
from corelens.errors import InputError

PHOTO = (100, 80)
PAGE = (200, 300)
FRAME = (64, 48)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A folder with a photo, two document pages, three video frames, a fake image and a clip file."""
    (tmp_path / "img").mkdir()
    Image.new("RGB", PHOTO, (255, 0, 0)).save(tmp_path / "img" / "photo.png")
    for i in range(2):
        Image.new("L", PAGE, 200 + i).save(tmp_path / f"page{i}.png")
    (tmp_path / "frames").mkdir()
    for i in range(3):
        Image.new("RGB", FRAME, (0, 10 * i, 0)).save(tmp_path / "frames" / f"f{i}.png")
    (tmp_path / "fake.png").write_text("this is not an image")
    (tmp_path / "clip.mp4").write_bytes(b"\x00" * 16)
    return tmp_path


def photo(**extra: Any) -> dict[str, Any]:
    """A good image sample with a box target; `extra` overrides or adds keys."""
    rec: dict[str, Any] = {
        "id": "photo-1",
        "task": "image",
        "images": ["img/photo.png"],
        "question": "What colour is the square?",
        "answer": "red",
        "choices": ["red", "blue"],
        "targets": [{"image": 0, "box": [10, 20, 50, 60]}],
    }
    rec.update(extra)
    return rec


def document(**extra: Any) -> dict[str, Any]:
    """A good two-page document sample: a whole-page target and a page-region target."""
    rec: dict[str, Any] = {
        "id": "doc-1",
        "task": "document",
        "images": ["page0.png", "page1.png"],
        "question": "What is the total?",
        "targets": [{"image": 1}, {"image": 0, "box": [0.5, 10.25, 200, 300]}],
    }
    rec.update(extra)
    return rec


def clip(**extra: Any) -> dict[str, Any]:
    """A good frames-video sample with a tube over frames 0 and 2."""
    rec: dict[str, Any] = {
        "id": "vid-1",
        "task": "video",
        "video": {"frames": ["frames/f0.png", "frames/f1.png", "frames/f2.png"], "fps": 2},
        "question": "Where does the ball go?",
        "targets": [{"frames": [0, 2], "boxes": [[0, 0, 10, 10], [54, 38, 64, 48]]}],
    }
    rec.update(extra)
    return rec


def write(folder: Path, *records: Any, name: str = "samples.jsonl") -> Path:
    """Write records (dicts as JSON, strings verbatim) one per line."""
    path = folder / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def drop(rec: dict[str, Any], key: str) -> dict[str, Any]:
    """Return a copy of `rec` without `key`."""
    return {k: v for k, v in rec.items() if k != key}


# --- good files ----------------------------------------------------------------------------------


def test_image_sample_with_box_target(data: Path) -> None:
    path = write(data, photo(source_dataset="refcoco", split="val"))
    samples, skipped = read_samples(path)
    assert skipped == []
    (s,) = samples
    assert s.id == "photo-1"
    assert s.task == "image"
    assert s.question == "What colour is the square?"
    assert s.images == ((data / "img" / "photo.png").absolute(),)
    assert s.images[0].is_absolute()
    assert s.image_sizes == (PHOTO,)
    assert s.video is None
    assert s.frame_sizes == ()
    assert s.answer == "red"
    assert s.choices == ("red", "blue")
    assert s.targets == (Target(kind="box", image=0, box=(10.0, 20.0, 50.0, 60.0)),)
    assert s.meta == {"source_dataset": "refcoco", "split": "val"}
    assert s.source == str(path)
    assert s.line == 1


def test_document_sample_page_and_page_region_targets(data: Path) -> None:
    (s,), _ = read_samples(write(data, document()))
    assert [p.name for p in s.images] == ["page0.png", "page1.png"]
    assert s.image_sizes == (PAGE, PAGE)
    assert s.targets == (
        Target(kind="image", image=1),
        Target(kind="box", image=0, box=(0.5, 10.25, 200.0, 300.0)),
    )
    assert s.answer is None and s.choices is None


def test_frames_video_sample_with_tube(data: Path) -> None:
    (s,), _ = read_samples(write(data, clip()))
    assert s.images == ()
    assert s.video == Video(
        frames=tuple((data / "frames" / f"f{i}.png").absolute() for i in range(3)),
        path=None,
        fps=2.0,
        max_frames=None,
    )
    assert s.frame_sizes == (FRAME, FRAME, FRAME)
    assert s.targets == (
        Target(kind="tube", frames=(0, 2), boxes=((0.0, 0.0, 10.0, 10.0), (54.0, 38.0, 64.0, 48.0))),
    )


def test_path_video_is_checked_for_existence_only(data: Path) -> None:
    rec = clip(
        video={"path": "clip.mp4", "fps": 1.5, "max_frames": 8},
        targets=[{"frames": [7], "boxes": [[0, 0, 5000, 5000]]}],  # frame size unknown: not checked
    )
    (s,), _ = read_samples(write(data, rec))
    assert s.video == Video(frames=None, path=(data / "clip.mp4").absolute(), fps=1.5, max_frames=8)
    assert s.frame_sizes == ()
    assert s.targets[0].frames == (7,)


def test_path_video_without_max_frames_defers_the_frame_check(data: Path) -> None:
    rec = clip(video={"path": "clip.mp4", "fps": 1}, targets=[{"frames": [999], "boxes": [[0, 0, 1, 1]]}])
    (s,), _ = read_samples(write(data, rec))
    assert s.video is not None and s.video.max_frames is None
    assert s.targets[0].frames == (999,)


def test_blank_lines_ignored_and_line_numbers_kept(data: Path) -> None:
    path = write(data, "", photo(), "   ", "", document())
    samples, _ = read_samples(path)
    assert [(s.id, s.line) for s in samples] == [("photo-1", 2), ("doc-1", 5)]


def test_task_defaults_and_nulls_mean_absent(data: Path) -> None:
    rec = drop(photo(answer=None, choices=None, targets=None, video=None), "task")
    (s,), _ = read_samples(write(data, rec))
    assert s.task == "default"
    assert (s.answer, s.choices, s.targets, s.video) == (None, None, (), None)


def test_boxes_touching_the_border_are_fine(data: Path) -> None:
    (s,), _ = read_samples(write(data, photo(targets=[{"image": 0, "box": [0, 0, 100, 80]}])))
    assert s.targets[0].box == (0.0, 0.0, 100.0, 80.0)


def test_absolute_image_path_is_kept(data: Path) -> None:
    absolute = str((data / "img" / "photo.png").absolute())
    (s,), _ = read_samples(write(data, photo(images=[absolute]), name="sub.jsonl"))
    assert s.images == (Path(absolute),)


def test_round_trip_through_to_json(data: Path) -> None:
    recs = [
        photo(extra_key={"a": [1, 2]}),
        document(),
        clip(),
        clip(id="vid-2", video={"path": "clip.mp4", "fps": 3, "max_frames": 4}, targets=[]),
    ]
    samples, _ = read_samples(write(data, *recs))
    dumped = [s.to_json(data) for s in samples]
    # Same content as written (JSON 10 == 10.0); empty targets are simply left out.
    assert dumped[:3] == recs[:3]
    assert dumped[3] == drop(recs[3], "targets")
    assert dumped[0]["images"] == ["img/photo.png"]
    # Written elsewhere, paths become relative to the new folder and still resolve.
    out = data / "out"
    assert write_samples(out / "copy.jsonl", [s.to_json(out) for s in samples]) == 4
    assert json.loads((out / "copy.jsonl").read_text().splitlines()[0])["images"] == ["../img/photo.png"]
    again, skipped = read_samples(out / "copy.jsonl")
    assert skipped == []
    strip = [{k: v for k, v in vars(s).items() if k != "source"} for s in samples]
    assert [{k: v for k, v in vars(s).items() if k != "source"} for s in again] == strip


def test_write_samples_writes_one_json_per_line(tmp_path: Path) -> None:
    path = tmp_path / "new" / "s.jsonl"
    assert write_samples(path, [{"id": "a", "q": "é"}, {"id": "b"}]) == 2
    assert path.read_text(encoding="utf-8") == '{"id": "a", "q": "é"}\n{"id": "b"}\n'
    with pytest.raises(ValueError):
        write_samples(path, [{"box": [float("nan")]}])


def test_sample_is_hashable_despite_meta(data: Path) -> None:
    (s,), _ = read_samples(write(data, photo(note="x")))
    assert {s: 1}[s] == 1


def test_target_rejects_inconsistent_fields() -> None:
    with pytest.raises(ValueError, match="kind"):
        Target(kind="circle", image=0)
    with pytest.raises(ValueError, match="wrong fields"):
        Target(kind="box", image=0)
    with pytest.raises(ValueError, match="one box per frame"):
        Target(kind="tube", frames=(0, 1), boxes=((0.0, 0.0, 1.0, 1.0),))


# --- bad records ---------------------------------------------------------------------------------

GOOD_TARGET = {"image": 0, "box": [1, 1, 2, 2]}
FRAMES3 = ["frames/f0.png", "frames/f1.png", "frames/f2.png"]

BAD: list[tuple[str, Any, str | None, str]] = [
    ("invalid-json", '{"id": "bad", "question": ', None, "invalid JSON"),
    ("nan", '{"id": "bad", "box": NaN}', None, "NaN is not valid JSON"),
    ("not-object", "[1, 2, 3]", None, "must be a JSON object, got array"),
    ("string-record", '"hello"', None, "got string"),
    ("missing-id", drop(photo(), "id"), "id", "missing required field 'id'"),
    ("empty-id", photo(id=""), "id", "must not be empty"),
    ("int-id", photo(id=7), "id", "must be a string, got number"),
    ("missing-question", drop(photo(id="bad"), "question"), "question", "missing required field"),
    ("blank-question", photo(id="bad", question="  "), "question", "must not be empty"),
    ("list-question", photo(id="bad", question=["q"]), "question", "got array"),
    ("int-task", photo(id="bad", task=3), "task", "must be a string"),
    ("empty-task", photo(id="bad", task=""), "task", "must not be empty"),
    ("bool-answer", photo(id="bad", answer=True, choices=None), "answer", "got boolean"),
    ("duplicate-id", photo(id="good"), "id", "duplicate id 'good'; first used on line 1"),
    ("images-string", photo(id="bad", images="img/photo.png"), "images", "must be an array of strings"),
    ("images-int", photo(id="bad", images=[3]), "images[0]", "must be a string, got number"),
    ("image-missing", photo(id="bad", images=["img/photo.png", "nope.png"]), "images[1]", "file not found"),
    ("image-is-folder", photo(id="bad", images=["img"]), "images[0]", "not a file"),
    ("image-unreadable", photo(id="bad", images=["fake.png"]), "images[0]", "not a readable image"),
    ("no-visual", drop(photo(id="bad", targets=[]), "images"), "images", "at least one visual input"),
    ("empty-images", photo(id="bad", images=[], targets=[]), "images", "at least one visual input"),
    ("video-not-object", clip(id="bad", video="clip.mp4"), "video", "must be an object"),
    ("video-no-source", clip(id="bad", video={"fps": 1}), "video", "exactly one of"),
    (
        "video-both",
        clip(id="bad", video={"frames": FRAMES3, "path": "clip.mp4", "fps": 1}),
        "video",
        "exactly one",
    ),
    ("video-unknown-key", clip(id="bad", video={"frames": FRAMES3, "fsp": 1}), "video", "unknown video key"),
    ("fps-missing", clip(id="bad", video={"frames": FRAMES3}), "video.fps", "missing 'fps'"),
    ("fps-string", clip(id="bad", video={"frames": FRAMES3, "fps": "2"}), "video.fps", "finite number"),
    ("fps-bool", clip(id="bad", video={"frames": FRAMES3, "fps": True}), "video.fps", "finite number"),
    ("fps-zero", clip(id="bad", video={"frames": FRAMES3, "fps": 0}), "video.fps", "must be > 0"),
    ("fps-negative", clip(id="bad", video={"frames": FRAMES3, "fps": -1.5}), "video.fps", "must be > 0"),
    (
        "frames-empty",
        clip(id="bad", video={"frames": [], "fps": 1}, targets=[]),
        "video.frames",
        "must not be empty",
    ),
    (
        "frames-not-list",
        clip(id="bad", video={"frames": "f0.png", "fps": 1}),
        "video.frames",
        "array of strings",
    ),
    (
        "frame-missing",
        clip(id="bad", video={"frames": ["frames/f0.png", "frames/f9.png", "frames/f2.png"], "fps": 1}),
        "video.frames[1]",
        "file not found",
    ),
    (
        "frame-unreadable",
        clip(id="bad", video={"frames": ["fake.png"], "fps": 1}),
        "video.frames[0]",
        "readable",
    ),
    (
        "frames-max-frames",
        clip(id="bad", video={"frames": FRAMES3, "fps": 1, "max_frames": 2}),
        "video.max_frames",
        "path",
    ),
    (
        "path-missing",
        clip(id="bad", video={"path": "nope.mp4", "fps": 1}, targets=[]),
        "video.path",
        "not found",
    ),
    ("path-int", clip(id="bad", video={"path": 5, "fps": 1}, targets=[]), "video.path", "non-empty string"),
    (
        "max-frames-zero",
        clip(id="bad", video={"path": "clip.mp4", "fps": 1, "max_frames": 0}),
        "video.max_frames",
        "positive",
    ),
    (
        "max-frames-float",
        clip(id="bad", video={"path": "clip.mp4", "fps": 1, "max_frames": 2.0}),
        "video.max_frames",
        "positive",
    ),
    ("targets-object", photo(id="bad", targets=GOOD_TARGET), "targets", "must be an array"),
    ("target-string", photo(id="bad", targets=["box"]), "targets[0]", "must be an object"),
    (
        "target-unknown-shape",
        photo(id="bad", targets=[GOOD_TARGET, {"foo": 1}]),
        "targets[1]",
        "unknown target key",
    ),
    ("target-typo", photo(id="bad", targets=[{"image": 0, "bbox": [1, 1, 2, 2]}]), "targets[0]", "['bbox']"),
    ("target-empty", photo(id="bad", targets=[{}]), "targets[0].image", "needs 'image'"),
    (
        "target-box-only",
        photo(id="bad", targets=[{"box": [1, 1, 2, 2]}]),
        "targets[0].image",
        "needs 'image'",
    ),
    (
        "target-mixed",
        clip(id="bad", targets=[{"image": 0, "frames": [0], "boxes": [[0, 0, 1, 1]]}]),
        "targets[0]",
        "mixes",
    ),
    ("tube-no-boxes", clip(id="bad", targets=[{"frames": [0, 1]}]), "targets[0].boxes", "needs 'boxes'"),
    (
        "tube-no-frames",
        clip(id="bad", targets=[{"boxes": [[0, 0, 1, 1]]}]),
        "targets[0].frames",
        "needs 'frames'",
    ),
    (
        "tube-length-mismatch",
        clip(id="bad", targets=[{"frames": [0, 1], "boxes": [[0, 0, 1, 1]]}]),
        "targets[0].boxes",
        "2 frame(s) but 1 box(es)",
    ),
    ("tube-empty", clip(id="bad", targets=[{"frames": [], "boxes": []}]), "targets[0].frames", "non-empty"),
    (
        "tube-without-video",
        photo(id="bad", targets=[{"frames": [0], "boxes": [[0, 0, 1, 1]]}]),
        "targets[0].frames",
        "needs a 'video'",
    ),
    (
        "tube-frame-out-of-range",
        clip(id="bad", targets=[{"frames": [0, 3], "boxes": [[0, 0, 1, 1], [0, 0, 1, 1]]}]),
        "targets[0].frames[1]",
        "frame index 3 out of range: the video has 3 frame(s)",
    ),
    (
        "tube-frame-negative",
        clip(id="bad", targets=[{"frames": [-1], "boxes": [[0, 0, 1, 1]]}]),
        "targets[0].frames[0]",
        "out of range",
    ),
    (
        "tube-frame-float",
        clip(id="bad", targets=[{"frames": [1.0], "boxes": [[0, 0, 1, 1]]}]),
        "targets[0].frames[0]",
        "integer",
    ),
    (
        "tube-frame-repeated",
        clip(id="bad", targets=[{"frames": [1, 1], "boxes": [[0, 0, 1, 1], [0, 0, 1, 1]]}]),
        "targets[0].frames[1]",
        "listed twice",
    ),
    (
        "tube-frame-beyond-max-frames",
        clip(
            id="bad",
            video={"path": "clip.mp4", "fps": 1, "max_frames": 4},
            targets=[{"frames": [4], "boxes": [[0, 0, 1, 1]]}],
        ),
        "targets[0].frames[0]",
        "the video has 4 frame(s)",
    ),
    (
        "tube-box-outside-frame",
        clip(id="bad", targets=[{"frames": [0, 2], "boxes": [[0, 0, 1, 1], [10, 10, 65, 20]]}]),
        "targets[0].boxes[1]",
        "outside frame 2 (64x48 pixels)",
    ),
    (
        "tube-box-inverted",
        clip(id="bad", targets=[{"frames": [0], "boxes": [[5, 5, 1, 9]]}]),
        "targets[0].boxes[0]",
        "inverted",
    ),
    (
        "box-3-numbers",
        photo(id="bad", targets=[{"image": 0, "box": [1, 2, 3]}]),
        "targets[0].box",
        "4 finite numbers",
    ),
    (
        "box-string",
        photo(id="bad", targets=[{"image": 0, "box": [1, 2, "3", 4]}]),
        "targets[0].box",
        "4 finite numbers",
    ),
    (
        "box-bool",
        photo(id="bad", targets=[{"image": 0, "box": [0, 0, True, 4]}]),
        "targets[0].box",
        "4 finite numbers",
    ),
    (
        "box-huge",
        '{"id": "bad", "images": ["img/photo.png"], "question": "q", "targets": [{"image": 0, "box": [0, 0, 1e999, 4]}]}',
        "targets[0].box",
        "finite",
    ),
    (
        "box-empty",
        photo(id="bad", targets=[{"image": 0, "box": [5, 5, 5, 9]}]),
        "targets[0].box",
        "empty or inverted",
    ),
    (
        "box-inverted",
        photo(id="bad", targets=[GOOD_TARGET, {"image": 0, "box": [5, 9, 8, 2]}]),
        "targets[1].box",
        "empty or inverted",
    ),
    (
        "box-negative",
        photo(id="bad", targets=[{"image": 0, "box": [-0.5, 0, 5, 5]}]),
        "targets[0].box",
        "outside image 0 (100x80",
    ),
    (
        "box-too-wide",
        photo(id="bad", targets=[{"image": 0, "box": [0, 0, 100.5, 5]}]),
        "targets[0].box",
        "outside image 0",
    ),
    (
        "box-too-tall",
        photo(id="bad", targets=[{"image": 0, "box": [0, 0, 5, 81]}]),
        "targets[0].box",
        "outside image 0",
    ),
    (
        "page-region-outside",
        document(id="bad", targets=[{"image": 1, "box": [0, 0, 10, 301]}]),
        "targets[0].box",
        "outside image 1 (200x300",
    ),
    (
        "image-index-out-of-range",
        document(id="bad", targets=[{"image": 2}]),
        "targets[0].image",
        "index 2 out of range: the sample has 2",
    ),
    (
        "image-index-negative",
        photo(id="bad", targets=[{"image": -1, "box": [1, 1, 2, 2]}]),
        "targets[0].image",
        "out of range",
    ),
    ("image-index-bool", photo(id="bad", targets=[{"image": False}]), "targets[0].image", "integer index"),
    (
        "image-target-on-video",
        clip(id="bad", targets=[{"image": 0}]),
        "targets[0].image",
        "the sample has 0 image(s)",
    ),
    ("choices-string", photo(id="bad", choices="red"), "choices", "array of strings"),
    ("choices-int", photo(id="bad", choices=["red", 2]), "choices[1]", "must be a string"),
    ("choices-empty", photo(id="bad", choices=[], answer=None), "choices", "must not be empty"),
    ("choices-duplicate", photo(id="bad", choices=["red", "blue", "red"]), "choices[2]", "duplicate choice"),
    ("answer-not-in-choices", photo(id="bad", answer="green"), "answer", "'green' is not one of the choices"),
]


@pytest.mark.parametrize(("record", "field", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_record_raises_naming_file_line_and_field(
    data: Path, record: Any, field: str | None, reason: str
) -> None:
    # The bad record sits on line 3, after a good one and a blank line.
    path = write(data, photo(id="good"), "", record)
    with pytest.raises(InputError) as info:
        read_samples(path)
    err = info.value
    message = str(err)
    assert f"{path}:3" in message
    assert path.name in message
    assert reason in message
    assert (err.file, err.line, err.field) == (str(path), 3, field)
    if field is not None:
        assert f"field {field!r}" in message
    expected_id = _readable_id(record)
    assert err.sample == expected_id
    if expected_id is not None:
        assert f"sample {expected_id!r}" in message


def _readable_id(record: Any) -> str | None:
    """The id the reader can report: that of a valid JSON object with a non-empty string id."""
    if isinstance(record, str):
        try:
            record = json.loads(record, parse_constant=lambda name: 1 / 0)
        except (ValueError, ZeroDivisionError):
            return None
    if isinstance(record, dict) and isinstance(record.get("id"), str) and record["id"]:
        return record["id"]
    return None


def test_missing_sample_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(InputError, match="nowhere.jsonl") as info:
        read_samples(path)
    assert "not found" in str(info.value)
    assert info.value.file == str(path)


def test_invalid_utf8_is_a_bad_record(data: Path) -> None:
    path = data / "s.jsonl"
    path.write_bytes(json.dumps(photo()).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputError, match=r"s\.jsonl:2.*UTF-8"):
        read_samples(path)


# --- skip_bad and limit --------------------------------------------------------------------------


def test_skip_bad_keeps_good_samples_and_lists_the_bad(data: Path) -> None:
    path = write(
        data,
        photo(id="a"),
        photo(id="b", targets=[{"image": 0, "box": [0, 0, 500, 5]}]),
        "",
        "not json",
        document(id="c"),
        photo(id="a"),
        clip(id="d"),
    )
    samples, skipped = read_samples(path, skip_bad=True)
    assert [(s.id, s.line) for s in samples] == [("a", 1), ("c", 5), ("d", 7)]
    assert [(k.line, k.sample_id, k.field) for k in skipped] == [
        (2, "b", "targets[0].box"),
        (4, None, None),
        (6, "a", "id"),
    ]
    assert all(k.file == str(path) for k in skipped)
    assert skipped[0].error.startswith(f"{path}:2, sample 'b', field 'targets[0].box': box")
    assert "invalid JSON" in skipped[1].error
    assert "duplicate id 'a'; first used on line 1" in skipped[2].error
    assert skipped[0].to_dict() == {
        "file": str(path),
        "line": 2,
        "sample_id": "b",
        "field": "targets[0].box",
        "error": skipped[0].error,
    }
    assert isinstance(skipped[0], SkippedSample)


def test_skip_bad_error_matches_the_raised_message(data: Path) -> None:
    path = write(data, photo(id="x", images=["fake.png"]))
    with pytest.raises(InputError) as info:
        read_samples(path)
    _, skipped = read_samples(path, skip_bad=True)
    assert skipped[0].error == str(info.value)


def test_bad_record_does_not_reserve_its_id(data: Path) -> None:
    path = write(data, photo(id="a", images=["fake.png"]), photo(id="a"))
    samples, skipped = read_samples(path, skip_bad=True)
    assert [s.line for s in samples] == [2]
    assert [k.line for k in skipped] == [1]


def test_limit_counts_good_samples(data: Path) -> None:
    path = write(data, photo(id="a"), "oops", photo(id="b"), photo(id="c"), "oops again")
    samples, skipped = read_samples(path, skip_bad=True, limit=2)
    assert [s.id for s in samples] == ["a", "b"]
    assert [k.line for k in skipped] == [2]
    # Reading stops at the limit, so a bad line after it is never reached, even without skip_bad.
    early = write(data, photo(id="a"), photo(id="b"), "oops", name="early.jsonl")
    samples, _ = read_samples(early, limit=2)
    assert [s.id for s in samples] == ["a", "b"]
    with pytest.raises(InputError, match="early.jsonl:3"):
        read_samples(early, limit=3)
    assert read_samples(path, limit=0) == ([], [])
    with pytest.raises(ValueError, match="limit"):
        read_samples(path, limit=-1)


# --- loading -------------------------------------------------------------------------------------


def test_load_images_gives_rgb_in_order(data: Path) -> None:
    (s,), _ = read_samples(write(data, document()))
    images = load_images(s)
    assert [im.size for im in images] == [PAGE, PAGE]
    assert [im.mode for im in images] == ["RGB", "RGB"]
    assert images[1].getpixel((0, 0)) == (201, 201, 201)


def test_load_images_names_sample_and_field_when_file_vanished(data: Path) -> None:
    (s,), _ = read_samples(write(data, document()))
    (data / "page1.png").unlink()
    with pytest.raises(InputError) as info:
        load_images(s)
    assert (info.value.sample, info.value.field, info.value.line) == ("doc-1", "images[1]", 1)
    assert "samples.jsonl:1" in str(info.value)


def test_load_video_frames_and_times(data: Path) -> None:
    (s,), _ = read_samples(write(data, clip()))
    frames, times = load_video(s)
    assert times == [0.0, 0.5, 1.0]
    assert [f.mode for f in frames] == ["RGB"] * 3
    assert frames[2].getpixel((0, 0)) == (0, 20, 0)


def test_load_video_without_video_is_an_error(data: Path) -> None:
    (s,), _ = read_samples(write(data, photo()))
    with pytest.raises(InputError, match="no video") as info:
        load_video(s)
    assert info.value.field == "video"


def test_load_path_video_without_pyav_says_how_to_install(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # makes `import av` raise ImportError
    (s,), _ = read_samples(write(data, clip(video={"path": "clip.mp4", "fps": 1}, targets=[])))
    with pytest.raises(InputError, match="pip install av") as info:
        load_video(s)
    assert (info.value.sample, info.value.field) == ("vid-1", "video.path")


def test_sample_times_thins_uniformly() -> None:
    assert sample_times(10.0, 1.0, None) == [float(k) for k in range(10)]
    assert sample_times(10.0, 1.0, 4) == [0.0, 3.0, 6.0, 9.0]
    assert sample_times(10.0, 1.0, 1) == [0.0]
    assert sample_times(2.0, 5.0, 20) == pytest.approx([k / 5 for k in range(10)])
    assert sample_times(0.0, 2.0, None) == [0.0]


def test_load_path_video_decodes_with_pyav(data: Path) -> None:
    av = pytest.importorskip("av")
    path = data / "real.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(20):  # 2 s at 10 fps, brightness rising with time
            frame = av.VideoFrame.from_image(Image.new("RGB", (64, 48), (i * 12, i * 12, i * 12)))
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    rec = clip(video={"path": "real.mp4", "fps": 5, "max_frames": 4}, targets=[])
    (s,), _ = read_samples(write(data, rec))
    frames, times = load_video(s)
    # Grid 0, 0.2, ..., 1.8 s thinned to 4 evenly spaced points.
    assert times == pytest.approx([0.0, 0.6, 1.2, 1.8], abs=1e-3)
    assert [f.size for f in frames] == [(64, 48)] * 4
    assert [f.mode for f in frames] == ["RGB"] * 4
    assert frames[0].getpixel((32, 24))[0] < frames[3].getpixel((32, 24))[0]


def test_load_path_video_that_is_not_a_video(data: Path) -> None:
    pytest.importorskip("av")
    (s,), _ = read_samples(write(data, clip(video={"path": "clip.mp4", "fps": 1}, targets=[])))
    with pytest.raises(InputError, match="cannot decode video") as info:
        load_video(s)
    assert info.value.field == "video.path"


def test_public_types_are_frozen(data: Path) -> None:
    (s,), _ = read_samples(write(data, photo()))
    with pytest.raises(AttributeError):
        s.id = "other"  # type: ignore[misc]
    assert isinstance(s, Sample)
