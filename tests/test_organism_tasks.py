"""The organism's synthetic tasks: determinism, exact targets read back from the pixels, balanced answers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import ndimage

from corelens.data import read_samples
from corelens.organism.tasks import (
    COLOURS,
    MARK,
    PALETTE,
    SHAPES,
    TASKS,
    generate,
    questions,
    render,
)

COLOUR_OF = {rgb: name for name, rgb in PALETTE.items()}


def blobs(image) -> list[dict]:
    """Return every object drawn in a palette colour: its colour, pixel mask, bounding box and centre."""
    pixels = np.asarray(image)
    found = []
    for rgb, name in COLOUR_OF.items():
        labels, count = ndimage.label(np.all(pixels == rgb, axis=-1))
        for k in range(1, count + 1):
            mask = labels == k
            ys, xs = np.nonzero(mask)
            found.append(
                {
                    "colour": name,
                    "mask": mask,
                    "bbox": (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1),
                    "centre": ((xs.min() + xs.max() + 1) / 2, (ys.min() + ys.max() + 1) / 2),
                }
            )
    return found


def inside(point, box) -> bool:
    return box[0] <= point[0] < box[2] and box[1] <= point[1] < box[3]


def contains(box, bbox) -> bool:
    return box[0] <= bbox[0] and box[1] <= bbox[1] and bbox[2] <= box[2] and bbox[3] <= box[3]


@pytest.mark.parametrize("task", TASKS)
def test_generation_is_deterministic_and_readable(task, tmp_path):
    a = generate(task, tmp_path / "a", 3, seed=5)
    b = generate(task, tmp_path / "b", 3, seed=5)
    c = generate(task, tmp_path / "c", 3, seed=6)
    assert a.read_bytes() == b.read_bytes()
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.png"))
    assert files and all(
        (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files
    )
    assert a.read_bytes() != c.read_bytes()
    samples, skipped = read_samples(a)
    assert len(samples) == 3 and not skipped
    for s in samples:
        assert s.answer in s.choices and len(s.choices) >= 5 and s.task == task


def asked(record: dict) -> str:
    """Return the asked attribute's value: the answer's last word (image and video answers restate the key
    word first, "red circle" / "up red"; document answers are the one word)."""
    return record["answer"].split()[-1]


@pytest.mark.parametrize("index", range(12))
def test_image_target_box_holds_the_referred_object_only(index):
    sample = render("image", index, seed=3)
    record, scene = sample.record, sample.record["scene"]
    box = record["targets"][0]["box"]
    found = blobs(sample.images[0])
    assert len(found) == len(scene["objects"])  # every object is one blob of its own palette colour
    hits = [b for b in found if inside(b["centre"], box)]
    assert len(hits) == 1, "the box must contain exactly one object's centre"
    referent = hits[0]
    assert contains(box, referent["bbox"])
    assert referent["mask"].sum() > 40
    assert asked(record) == scene["objects"][0]["shape"]
    assert referent["colour"] == scene["objects"][0]["colour"]  # the box holds the referent's own pixels
    # The named attributes pick exactly one object of the scene.
    named = scene["named"]
    fits = [o for o in scene["objects"] if all(o[k] == scene["objects"][0][k] for k in named)]
    assert len(fits) == 1
    for word in (scene["objects"][0][k] for k in named):
        assert word in record["question"].split()


@pytest.mark.parametrize("index", range(8))
def test_video_tube_follows_the_moving_object(index):
    sample = render("video", index, seed=3)
    record, scene = sample.record, sample.record["scene"]
    tube = record["targets"][0]
    assert tube["frames"] == list(range(len(sample.frames))) and 4 <= len(sample.frames) <= 8
    centres = []
    for frame, box in zip(sample.frames, tube["boxes"]):
        hits = [b for b in blobs(frame) if inside(b["centre"], box)]
        assert len(hits) == 1
        assert contains(box, hits[0]["bbox"])
        assert hits[0]["colour"] == asked(record)
        centres.append(hits[0]["centre"])
    dx, dy = np.diff(np.array(centres), axis=0).T
    motion = scene["objects"][0]["motion"]
    expected = {
        "up": (dx == 0) & (dy < 0),
        "down": (dx == 0) & (dy > 0),
        "left": (dx < 0) & (dy == 0),
        "right": (dx > 0) & (dy == 0),
        "still": (dx == 0) & (dy == 0),
    }[motion]
    assert expected.all(), f"the tube does not move {motion}"
    assert motion in record["question"].split()
    # The motion names one object: no other object moves the same way.
    assert [o["motion"] for o in scene["objects"]].count(motion) == 1


@pytest.mark.parametrize("index", range(8))
def test_document_targets_are_the_marked_block(index):
    sample = render("document", index, seed=3)
    record = sample.record
    page_target, box_target = record["targets"]
    page = page_target["image"]
    assert box_target["image"] == page and 4 <= len(sample.images) <= 12
    x0, y0, x1, y1 = box_target["box"]
    for p, image in enumerate(sample.images):
        black = np.all(np.asarray(image) == MARK, axis=-1)
        if p != page:
            assert not black.any(), "only the marked page has a mark"
            continue
        ys, xs = np.nonzero(black)
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x0, y0, x1, y1)
        figures = [b for b in blobs(image) if inside(b["centre"], (x0, y0, x1, y1))]
        assert len(figures) == 1 and contains((x0, y0, x1, y1), figures[0]["bbox"])
        if record["scene"]["ask"] == "colour":
            assert figures[0]["colour"] == asked(record)


@pytest.mark.parametrize("task", TASKS)
def test_answers_are_balanced_and_not_given_by_the_question(task):
    records = [render(task, i, seed=4).record for i in range(240)]
    for ask, values in (("colour", COLOURS), ("shape", SHAPES)):
        answers = Counter(asked(r) for r in records if r["scene"]["ask"] == ask)
        if not answers:
            continue
        assert set(answers) <= set(values)
        assert max(answers.values()) / sum(answers.values()) < 2.2 / len(values)
    for r in records:
        # The asked word is never in the question; any word before it restates one of the question's.
        assert asked(r) not in r["question"].split()
        assert all(word in r["question"].split() for word in r["answer"].split()[:-1])
        assert (r["question"], r["answer"]) in questions(r)


def test_answers_restate_the_key_the_question_names():
    for i in range(20):
        image, video, document = (render(task, i, seed=5).record for task in TASKS)
        referent = image["scene"]["objects"][0]
        assert image["answer"] == f"{referent['colour']} {referent['shape']}"
        assert all(c.split()[0] == referent["colour"] for c in image["choices"])
        mover = video["scene"]["objects"][0]
        assert video["answer"] == f"{mover['motion']} {mover['colour']}"
        assert len(document["answer"].split()) == 1 and document["answer"] in document["choices"]


@pytest.mark.parametrize("task", TASKS)
def test_curriculum_levels_shrink_scenes_but_full_level_is_the_task(task):
    """Level 0 (training curriculum only) gives the smallest scenes; level 1 is what `generate` writes."""

    def size(record: dict) -> int:
        return len(record["scene"]["pages"]) if task == "document" else len(record["scene"]["objects"])

    easy = [size(render(task, i, seed=8, level=0.0).record) for i in range(40)]
    full = [size(render(task, i, seed=8).record) for i in range(40)]
    low, high = {"image": (4, 8), "video": (3, 5), "document": (4, 12)}[task]
    assert all(low <= n <= high for n in full) and max(full) > low
    assert max(easy) <= (
        4 if task == "image" else 2
    )  # 1-2 objects / pages (+ the confusers a 2-word name needs)
    assert sum(easy) < sum(full)
