"""Synthetic grounding tasks with exact targets, written in corelens' sample format (README.md#sample-format).

Three domains mirror the CoRe-heads paper's benchmarks, each deterministic from (seed, task, index):
- `image` (RefCOCOg-like referring expressions): 4-8 objects (shape x colour x size) on a cluttered
  background, each inside its own 28-pixel token cell; the question names one object by its colour or by
  size + colour and asks for its shape; the target is its box.
- `video` (VidSTG-like): 4-8 frames, 3-5 objects that each move differently (up, down, left, right or
  not at all); the question names an object by its motion and asks its colour; the target is its tube.
- `document` (MMLongBench / MMDocIR-like): 4-12 pages of token-sized text and figure blocks; one figure
  block in the whole document is marked with a thick black frame; the question asks the colour or
  shape of its figure; the targets are the page and the block.

Every answer restates the question's key word, then gives the asked value: "red circle" (image: colour
named, shape asked), "up red" (video: motion named, colour asked); document answers are one word. The
asked value is drawn uniformly from its closed set (6 colours or 5 shapes) independently of the question's
wording, so the question alone gives away only the restated word. Restating the key makes the asked word
follow a token that carries the retrieval key, so the model looks it up in one hop rather than two: the
one-word design did not learn image and video within the CPU budget (benchmarks/organism/README.md).
Objects are drawn without anti-aliasing in exact palette colours that no background pixel can take, so
tests can find every object's pixels in the saved image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from corelens.data.sample import write_samples
from corelens.errors import OptionError

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 140, 10),
    "yellow": (235, 220, 20),
    "green": (30, 170, 50),
    "blue": (30, 80, 235),
    "purple": (150, 40, 210),
}
COLOURS = tuple(PALETTE)
SHAPES = ("square", "circle", "triangle", "cross", "ring")
SIZES = ("small", "large")
MOTIONS = ("up", "down", "left", "right", "still")
MOTION_WORDS = {m: f"moving {m}" for m in MOTIONS[:4]} | {"still": "standing still"}
TASKS = ("image", "video", "document")
WORDS = (
    *COLOURS,
    *SHAPES,
    *SIZES,
    *MOTIONS,
    "moving",
    "standing",
    "figure",
    "marked",
    "block",
    "size",
    "number",
)

IMAGE_NAMINGS = (("colour",), ("size", "colour"))  # how image questions name their object

CELL = 28  # pixels per visual token (14 px patches, 2 x 2 merge)
IMAGE_SIZE = (168, 168)  # 6 x 6 visual tokens
FRAME_SIZE = (112, 112)  # 4 x 4 tokens per group of 2 frames
PAGE_SIZE = (84, 112)  # 3 x 4 tokens per page
SMALL_SIDE, LARGE_SIDE = (14, 17), (23, 26)
VIDEO_SIDE = (16, 20)
VIDEO_SPEED = (5, 7)  # pixels per frame
FIGURE_SIDE = (12, 16)
FPS = 2.0
MARK = (0, 0, 0)
TEXT_INK = (70, 70, 70)
PAPER = (246, 244, 238)

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels, x1 / y1 exclusive


@dataclass
class Rendered:
    """One generated sample: its interchange-format record and the images it names, not yet saved."""

    record: dict
    images: list[Image.Image] = field(default_factory=list)
    frames: list[Image.Image] = field(default_factory=list)

    def save(self, folder: Path) -> None:
        """Write the images / frames to the paths the record names, relative to `folder`."""
        names = list(self.record.get("images", [])) + list(self.record.get("video", {}).get("frames", []))
        for name, image in zip(names, [*self.images, *self.frames]):
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path, format="PNG")


def sample_rng(seed: int, task: str, index: int) -> np.random.Generator:
    """Return the random generator of sample `index` of `task` under `seed` (samples are independent)."""
    return np.random.default_rng([seed, TASKS.index(task), index])


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: Box, colour: tuple[int, int, int]) -> None:
    """Draw a filled `shape` whose pixels all lie inside `box` (x1 / y1 exclusive), without anti-aliasing."""
    x0, y0, x1, y1 = box
    x1, y1 = x1 - 1, y1 - 1
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    if shape == "square":
        draw.rectangle((x0, y0, x1, y1), fill=colour)
    elif shape == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=colour)
    elif shape == "ring":
        draw.ellipse((x0, y0, x1, y1), outline=colour, width=max(3, (x1 - x0 + 1) // 5))
    elif shape == "cross":
        t = max(2, (x1 - x0 + 1) // 6)
        draw.rectangle((x0, cy - t, x1, cy + t), fill=colour)
        draw.rectangle((cx - t, y0, cx + t, y1), fill=colour)
    else:
        raise OptionError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def _muted(rng: np.random.Generator, low: int = 60, high: int = 190) -> tuple[int, int, int]:
    """Return a low-saturation colour: never equal to a palette colour (those have channel spreads > 100)."""
    v = int(rng.integers(low, high))
    return tuple(int(np.clip(v + d, 0, 255)) for d in rng.integers(-15, 16, 3))  # type: ignore[return-value]


def cluttered_background(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """Return a noisy grey background with muted lines, outlines and blobs."""
    width, height = size
    base = int(rng.integers(100, 150))
    grey = rng.integers(-22, 23, (height, width, 1))
    tint = rng.integers(-8, 9, (1, 1, 3))
    image = Image.fromarray(np.clip(base + grey + tint, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(6, 14))):
        kind = int(rng.integers(0, 3))
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        w, h = int(rng.integers(6, 40)), int(rng.integers(6, 40))
        if kind == 0:
            draw.line(
                (x, y, x + w * int(rng.choice([-1, 1])), y + h),
                fill=_muted(rng),
                width=int(rng.integers(1, 3)),
            )
        elif kind == 1:
            draw.rectangle((x, y, x + w, y + h), outline=_muted(rng))
        else:
            draw.ellipse((x, y, x + w // 2, y + h // 2), fill=_muted(rng))
    return image


def _apart(box: Box, others: list[Box], gap: int) -> bool:
    """Return whether `box` keeps at least `gap` pixels from every box in `others`."""
    x0, y0, x1, y1 = box
    return all(x1 + gap <= b[0] or b[2] + gap <= x0 or y1 + gap <= b[1] or b[3] + gap <= y0 for b in others)


def _in_cell(rng: np.random.Generator, cell: int, size: tuple[int, int], side: int) -> Box:
    """Return a `side`-square box at a random offset strictly inside token cell `cell` (row-major)."""
    cols = size[0] // CELL
    x = (cell % cols) * CELL + int(rng.integers(1, CELL - side))
    y = (cell // cols) * CELL + int(rng.integers(1, CELL - side))
    return (x, y, x + side, y + side)


def _other(rng: np.random.Generator, values: tuple[str, ...], *exclude: str) -> str:
    """Return a random value of `values` that is not in `exclude`."""
    pool = [v for v in values if v not in exclude]
    return pool[int(rng.integers(0, len(pool)))]


def _pick(rng: np.random.Generator, values: tuple[str, ...]) -> str:
    return values[int(rng.integers(0, len(values)))]


def _question_parts(ask: str) -> tuple[str, list[str]]:
    """Return the question's asked word and the choices for `ask` ("colour" or "shape")."""
    return ask, list(COLOURS if ask == "colour" else SHAPES)


def _side(rng: np.random.Generator, size: str) -> int:
    low, high = SMALL_SIDE if size == "small" else LARGE_SIDE
    return int(rng.integers(low, high + 1))


def _span(level: float, easy: tuple[int, int], full: tuple[int, int]) -> tuple[int, int]:
    """Return the [low, high] range of a count at curriculum `level` (0 = easy, 1 = the task's own range)."""
    low = round(easy[0] + level * (full[0] - easy[0]))
    return low, max(low, round(easy[1] + level * (full[1] - easy[1])))


def _image_objects(
    rng: np.random.Generator, ask: str, named: tuple[str, ...], referent: dict, level: float = 1.0
) -> list[dict]:
    """Return the referent plus 3-7 distractors: none fits the description, none shares the answer."""
    low, high = _span(level, (1, 2), (4, 8))
    count = int(rng.integers(low, high + 1))
    objects = [referent]
    # Confusers share part of a two-word description, so that one attribute alone is not enough.
    if len(named) == 2:
        for keep in named:
            obj = {"colour": "", "shape": "", "size": ""}
            obj[keep] = referent[keep]
            for key in ("colour", "shape", "size"):
                if obj[key]:
                    continue
                values = {"colour": COLOURS, "shape": SHAPES, "size": SIZES}[key]
                obj[key] = (
                    _other(rng, values, referent[key]) if key in named or key == ask else _pick(rng, values)
                )
            objects.append(obj)
    while len(objects) < count:
        obj = {"colour": _pick(rng, COLOURS), "shape": _pick(rng, SHAPES), "size": _pick(rng, SIZES)}
        fits = all(obj[k] == referent[k] for k in named)
        if not fits and obj[ask] != referent[ask]:
            objects.append(obj)
    return objects


def image_answer(obj: dict) -> str:
    """Return the answer to an image question: the object's colour (restated) then its shape, "red circle".

    Restating the colour the question named makes the answer's second token follow a token that carries
    the retrieval key, so the model looks up the shape from there (one hop) rather than from the end of
    the prompt (two hops): a design that trains in the CPU budget. Only the colour is restated, also when
    the question adds the size, so telling the small from the large red object still reads the question.
    The colour alone is given away by the question; the shape, and so the answer, needs the image.
    """
    return f"{obj['colour']} {obj['shape']}"


def video_answer(obj: dict) -> str:
    """Return the answer to a video question: the object's motion (restated) then its colour, "up red".

    Restating the motion the question named makes the colour follow a token that carries the retrieval
    key, so it is looked up from there in one hop; the motion alone is given away by the question, the
    colour needs the frames.
    """
    return f"{obj['motion']} {obj['colour']}"


def image_sample(rng: np.random.Generator, index: int, level: float = 1.0) -> Rendered:
    """Return one `image` sample: find the object named by its colour (and size), answer its shape."""
    ask = "shape"  # found by colour (and size), so that the retrieval key is a colour
    named = IMAGE_NAMINGS[int(rng.integers(0, len(IMAGE_NAMINGS)))]
    referent = {"colour": _pick(rng, COLOURS), "shape": _pick(rng, SHAPES), "size": _pick(rng, SIZES)}
    objects = _image_objects(rng, ask, named, referent, level)
    # Each object sits inside one token cell (so shapes are seen whole, at small offsets) and objects in
    # neighbouring cells stay at least 2 pixels apart.
    cells = rng.permutation((IMAGE_SIZE[0] // CELL) * (IMAGE_SIZE[1] // CELL))[: len(objects)]
    for obj, cell in zip(objects, cells):
        obj["box"] = list(_in_cell(rng, int(cell), IMAGE_SIZE, _side(rng, obj["size"])))
    image = cluttered_background(rng, IMAGE_SIZE)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        draw_shape(draw, obj["shape"], tuple(obj["box"]), PALETTE[obj["colour"]])
    if ask == "colour":
        description = " ".join(referent[k] for k in named)
    else:
        description = " ".join(referent[k] for k in named) + " object"
    word, choices = _question_parts(ask)
    name = f"img/{index:05d}.png"
    record = {
        "id": f"image-{index:05d}",
        "task": "image",
        "images": [name],
        "question": f"what {word} is the {description} ?",
        "answer": image_answer(referent),
        "choices": [image_answer({**referent, "shape": s}) for s in choices],
        "targets": [{"image": 0, "box": list(referent["box"])}],
        "scene": {"objects": objects, "referent": 0, "named": list(named), "ask": ask},
    }
    return Rendered(record, images=[image])


def _path(start: tuple[int, int], motion: str, speed: int, frames: int, side: int) -> list[Box]:
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0), "still": (0, 0)}[motion]
    x, y = start
    return [
        (x + dx * speed * f, y + dy * speed * f, x + dx * speed * f + side, y + dy * speed * f + side)
        for f in range(frames)
    ]


def _start_range(motion: str, speed: int, frames: int, side: int, extent: int, axis: int) -> tuple[int, int]:
    """Return the [low, high] start coordinate on `axis` keeping the whole path inside the frame."""
    travel = speed * (frames - 1)
    forward = {"right": 0, "down": 1}
    backward = {"left": 0, "up": 1}
    if forward.get(motion) == axis:
        return 0, extent - side - travel
    if backward.get(motion) == axis:
        return travel, extent - side
    return 0, extent - side


def video_sample(rng: np.random.Generator, index: int, level: float = 1.0) -> Rendered:
    """Return one `video` sample: find the object by its motion over time, answer its colour.

    Objects move freely across token cells, so their shapes are seen at every offset; the question asks
    for the colour, which stays legible at any offset (shapes are decoration here).
    """
    frames = int(rng.integers(4, 9))
    ask = "colour"
    low, high = _span(level, (1, 2), (3, 5))
    count = int(rng.integers(low, high + 1))
    motions = [MOTIONS[i] for i in rng.permutation(len(MOTIONS))[:count]]
    referent = {"colour": _pick(rng, COLOURS), "shape": _pick(rng, SHAPES)}
    objects = [dict(referent, motion=motions[0])]
    for motion in motions[1:]:
        obj = {"colour": _pick(rng, COLOURS), "shape": _pick(rng, SHAPES), "motion": motion}
        obj[ask] = _other(rng, COLOURS if ask == "colour" else SHAPES, referent[ask])
        objects.append(obj)
    while True:
        paths: list[list[Box]] = []
        for obj in objects:
            side = int(rng.integers(VIDEO_SIDE[0], VIDEO_SIDE[1] + 1))
            speed = 0 if obj["motion"] == "still" else int(rng.integers(VIDEO_SPEED[0], VIDEO_SPEED[1] + 1))
            lx, hx = _start_range(obj["motion"], speed, frames, side, FRAME_SIZE[0], 0)
            ly, hy = _start_range(obj["motion"], speed, frames, side, FRAME_SIZE[1], 1)
            path = _path(
                (int(rng.integers(lx, hx + 1)), int(rng.integers(ly, hy + 1))),
                obj["motion"],
                speed,
                frames,
                side,
            )
            if not all(_apart(path[f], [p[f] for p in paths], 3) for f in range(frames)):
                break
            paths.append(path)
        if len(paths) == len(objects):
            break
    background = cluttered_background(rng, FRAME_SIZE)
    images = []
    for f in range(frames):
        frame = background.copy()
        draw = ImageDraw.Draw(frame)
        for obj, path in zip(objects, paths):
            draw_shape(draw, obj["shape"], path[f], PALETTE[obj["colour"]])
        images.append(frame)
    for obj, path in zip(objects, paths):
        obj["boxes"] = [list(b) for b in path]
    word, choices = _question_parts(ask)
    names = [f"vid/{index:05d}-{f}.png" for f in range(frames)]
    record = {
        "id": f"video-{index:05d}",
        "task": "video",
        "video": {"frames": names, "fps": FPS},
        "question": f"what {word} is the object {MOTION_WORDS[objects[0]['motion']]} ?",
        "answer": video_answer(objects[0]),
        "choices": [video_answer({"motion": objects[0]["motion"], "colour": c}) for c in choices],
        "targets": [{"frames": list(range(frames)), "boxes": [list(b) for b in paths[0]]}],
        "scene": {"objects": objects, "referent": 0, "ask": ask},
    }
    return Rendered(record, frames=images)


def _text_block(draw: ImageDraw.ImageDraw, rng: np.random.Generator, box: Box) -> None:
    """Draw lines of glyph-like dashes inside `box`."""
    x0, y0, x1, y1 = box
    for y in range(y0 + 4, y1 - 4, 4):
        x = x0 + 3
        while x < x1 - 6:
            w = int(rng.integers(2, 7))
            draw.rectangle((x, y, min(x + w, x1 - 4), y + 1), fill=TEXT_INK)
            x += w + 3


def _figure_block(
    draw: ImageDraw.ImageDraw, rng: np.random.Generator, box: Box, fig: dict, marked: bool
) -> None:
    """Draw a framed figure block (thick black frame when marked); set the figure's box in `fig`."""
    x0, y0, x1, y1 = box
    if marked:
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), outline=MARK, width=3)
    else:
        draw.rectangle((x0 + 1, y0 + 1, x1 - 2, y1 - 2), outline=(150, 150, 150), width=1)
    side = fig["side"]
    fx = x0 + (x1 - x0 - side) // 2 + int(rng.integers(-1, 2))
    fy = y0 + (y1 - y0 - side) // 2 + int(rng.integers(-1, 2))
    fig["box"] = [fx, fy, fx + side, fy + side]
    draw_shape(draw, fig["shape"], (fx, fy, fx + side, fy + side), PALETTE[fig["colour"]])


def document_sample(rng: np.random.Generator, index: int, level: float = 1.0) -> Rendered:
    """Return one `document` sample: 4-12 pages; ask the colour or shape of the marked block's figure.

    A page is a 3 x 4 grid of token-sized blocks: 1-3 figure blocks (a framed coloured shape), 2-5 text
    blocks (glyph lines), the rest blank paper. Exactly one figure block of the document is marked.
    """
    low, high = _span(level, (1, 2), (4, 12))
    pages = int(rng.integers(low, high + 1))
    ask = "colour" if rng.random() < 0.5 else "shape"
    marked_page = int(rng.integers(0, pages))
    answer_fig = {"colour": _pick(rng, COLOURS), "shape": _pick(rng, SHAPES)}
    cols, rows = PAGE_SIZE[0] // CELL, PAGE_SIZE[1] // CELL
    images, blocks_per_page = [], []
    target: list[int] = []
    for p in range(pages):
        page = Image.new("RGB", PAGE_SIZE, PAPER)
        draw = ImageDraw.Draw(page)
        n_fig, n_text = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        cells = sorted(rng.permutation(cols * rows)[: n_fig + n_text].tolist())
        figure_cells = set(rng.permutation(cells)[:n_fig].tolist())
        marked_cell = int(rng.choice(sorted(figure_cells))) if p == marked_page else -1
        blocks = []
        for cell in cells:
            x, y = (cell % cols) * CELL, (cell // cols) * CELL
            box = (x, y, x + CELL, y + CELL)
            block: dict = {"kind": "figure" if cell in figure_cells else "text", "box": list(box)}
            block["marked"] = cell == marked_cell
            if cell in figure_cells:
                fig = (
                    dict(answer_fig)
                    if block["marked"]
                    else {"colour": _pick(rng, COLOURS), "shape": _pick(rng, SHAPES)}
                )
                fig["side"] = int(rng.integers(FIGURE_SIDE[0], FIGURE_SIDE[1] + 1))
                _figure_block(draw, rng, box, fig, block["marked"])
                block["figure"] = fig
            else:
                _text_block(draw, rng, box)
            if block["marked"]:
                target = list(box)
            blocks.append(block)
        images.append(page)
        blocks_per_page.append(blocks)
    word, choices = _question_parts(ask)
    names = [f"doc/{index:05d}-{p}.png" for p in range(pages)]
    record = {
        "id": f"document-{index:05d}",
        "task": "document",
        "images": names,
        "question": f"what {word} is the figure in the marked block ?",
        "answer": answer_fig[ask],
        "choices": choices,
        "targets": [{"image": marked_page}, {"image": marked_page, "box": target}],
        "scene": {"pages": blocks_per_page, "marked_page": marked_page, "ask": ask},
    }
    return Rendered(record, images=images)


def _image_questions(scene: dict) -> list[tuple[str, str]]:
    objects = scene["objects"]
    out = []
    for obj in objects:
        for ask, options in (("shape", IMAGE_NAMINGS),):
            for named in options:
                if sum(all(o[k] == obj[k] for k in named) for o in objects) != 1:
                    continue
                description = " ".join(obj[k] for k in named) + ("" if ask == "colour" else " object")
                out.append((f"what {ask} is the {description} ?", image_answer(obj)))
    return out


def questions(record: dict) -> list[tuple[str, str]]:
    """Return every (question, answer) the scene of a generated record answers unambiguously.

    Training asks several of them about one rendered scene (extra chat turns after the sample's own
    question), which multiplies the supervision per encoded image; evaluation asks only the sample's own.
    """
    scene, task = record["scene"], record["task"]
    if task == "image":
        return _image_questions(scene)
    if task == "video":
        return [
            (f"what colour is the object {MOTION_WORDS[obj['motion']]} ?", video_answer(obj))
            for obj in scene["objects"]
        ]
    if task == "document":
        figure = next(b["figure"] for b in scene["pages"][scene["marked_page"]] if b["marked"])
        return [
            (f"what {ask} is the figure in the marked block ?", figure[ask]) for ask in ("colour", "shape")
        ]
    raise OptionError(f"unknown task {task!r}; expected one of {TASKS}")


GENERATORS: dict[str, Callable[[np.random.Generator, int, float], Rendered]] = {
    "image": image_sample,
    "video": video_sample,
    "document": document_sample,
}


def render(task: str, index: int, seed: int = 0, level: float = 1.0) -> Rendered:
    """Return sample `index` of `task` under `seed`, in memory (the same as `generate` writes).

    `level` < 1 is for the training curriculum only: fewer objects (image, video) or pages (document).
    """
    if task not in GENERATORS:
        raise OptionError(f"unknown task {task!r}; expected one of {TASKS}")
    return GENERATORS[task](sample_rng(seed, task, index), index, level)


def generate(task: str, folder: str | Path, n: int, seed: int = 0) -> Path:
    """Write `n` samples of `task` (images + `<task>.jsonl`) into `folder`; return the JSONL path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(n):
        sample = render(task, i, seed)
        sample.save(folder)
        records.append(sample.record)
    path = folder / f"{task}.jsonl"
    write_samples(path, records)
    return path


def chance(record: dict) -> float:
    """Return the chance accuracy of one sample (one over its number of choices)."""
    return 1.0 / len(record["choices"])
