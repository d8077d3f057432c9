"""Synthetic grounding tasks with exact targets, written in corelens' sample format.

Three domains, each deterministic from a seed: `image` (find an object by colour and shape, answer its size),
`video` (a moving square; the tube follows it), `document` (pages of glyph blocks; one marked block).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from corelens.data.sample import write_samples

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
SHAPES = ("square", "circle")
SIZES = ("small", "large")
TASKS = ("image", "video", "document")
WORDS = (*COLOURS, *SHAPES, *SIZES, "moving", "marked", "size", "number")


def _background(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    noise = rng.integers(90, 140, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(noise)


def _draw(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], colour: tuple) -> None:
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    else:
        draw.rectangle(box, fill=colour)


def _place(
    rng: np.random.Generator, taken: list, width: int, height: int, side: int
) -> tuple[int, int, int, int]:
    for _ in range(200):
        x, y = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
        box = (x, y, x + side, y + side)
        if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in taken):
            return box
    raise RuntimeError("could not place an object without overlap")


def image_sample(rng: np.random.Generator, folder: Path, index: int) -> dict:
    """Return one `image` sample: 4-6 objects; the question names one by colour + shape, asks its size."""
    width, height = int(rng.integers(200, 320)), int(rng.integers(160, 260))
    image = _background(rng, width, height)
    draw = ImageDraw.Draw(image)
    combos = [(c, s) for c in COLOURS for s in SHAPES]
    picks = rng.choice(len(combos), size=int(rng.integers(4, 7)), replace=False)
    taken: list = []
    objects = []
    for p in picks:
        colour, shape = combos[p]
        size = SIZES[int(rng.integers(0, 2))]
        box = _place(rng, taken, width, height, 28 if size == "small" else 56)
        taken.append(box)
        _draw(draw, shape, box, COLOURS[colour])
        objects.append((colour, shape, size, box))
    colour, shape, size, box = objects[int(rng.integers(0, len(objects)))]
    name = f"img/{index:05d}.png"
    (folder / "img").mkdir(parents=True, exist_ok=True)
    image.save(folder / name)
    return {
        "id": f"image-{index:05d}",
        "task": "image",
        "images": [name],
        "question": f"what is the size of the {colour} {shape} ?",
        "answer": size,
        "choices": list(SIZES),
        "targets": [{"image": 0, "box": list(box)}],
    }


def video_sample(rng: np.random.Generator, folder: Path, index: int, frames: int = 6) -> dict:
    """Return one `video` sample: a moving square among still ones; the tube follows the mover."""
    width, height, side = 160, 112, 24
    colours = list(COLOURS)
    order = rng.permutation(len(colours))
    mover = colours[order[0]]
    still = [colours[i] for i in order[1:3]]
    x, y = int(rng.integers(0, width - side)), int(rng.integers(0, height - side))
    dx, dy = int(rng.choice([-12, 12])), int(rng.choice([-8, 8]))
    statics = [_place(rng, [], width, height, side) for _ in still]
    base = _background(rng, width, height)
    names, boxes = [], []
    (folder / "vid").mkdir(parents=True, exist_ok=True)
    for f in range(frames):
        if not 0 <= x + dx <= width - side:
            dx = -dx
        if not 0 <= y + dy <= height - side:
            dy = -dy
        x, y = x + dx, y + dy
        frame = base.copy()
        draw = ImageDraw.Draw(frame)
        for colour, box in zip(still, statics):
            _draw(draw, "square", box, COLOURS[colour])
        box = (x, y, x + side, y + side)
        _draw(draw, "square", box, COLOURS[mover])
        name = f"vid/{index:05d}-{f}.png"
        frame.save(folder / name)
        names.append(name)
        boxes.append(list(box))
    return {
        "id": f"video-{index:05d}",
        "task": "video",
        "video": {"frames": names, "fps": 2.0},
        "question": "what is the colour of the moving square ?",
        "answer": mover,
        "choices": colours,
        "targets": [{"frames": list(range(frames)), "boxes": boxes}],
    }


def document_sample(rng: np.random.Generator, folder: Path, index: int) -> dict:
    """Return one `document` sample: 4-6 pages of glyph blocks; one block is marked; ask its page number."""
    pages = int(rng.integers(4, 7))
    width, height = 120, 160
    marked_page = int(rng.integers(0, pages))
    names = []
    target_box = None
    (folder / "doc").mkdir(parents=True, exist_ok=True)
    for p in range(pages):
        page = Image.new("RGB", (width, height), (245, 245, 240))
        draw = ImageDraw.Draw(page)
        blocks = []
        for _ in range(int(rng.integers(2, 4))):
            box = _place(rng, blocks, width, height - 20, 36)
            blocks.append(box)
            for line in range(box[1] + 4, box[3] - 2, 6):
                draw.line((box[0] + 2, line, box[2] - 2, line), fill=(30, 30, 30), width=2)
        if p == marked_page:
            target_box = blocks[0]
            draw.rectangle(target_box, outline=(220, 40, 40), width=3)
        name = f"doc/{index:05d}-{p}.png"
        page.save(folder / name)
        names.append(name)
    return {
        "id": f"document-{index:05d}",
        "task": "document",
        "images": names,
        "question": "what is the page number of the marked block ?",
        "answer": str(marked_page + 1),
        "choices": [str(i + 1) for i in range(pages)],
        "targets": [{"image": marked_page}, {"image": marked_page, "box": list(target_box)}],
    }


GENERATORS = {"image": image_sample, "video": video_sample, "document": document_sample}


def generate(task: str, folder: str | Path, n: int, seed: int = 0) -> Path:
    """Write `n` samples of `task` (images + `<task>.jsonl`) into `folder`; return the JSONL path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, TASKS.index(task)])
    records = [GENERATORS[task](rng, folder, i) for i in range(n)]
    path = folder / f"{task}.jsonl"
    write_samples(path, records)
    return path
