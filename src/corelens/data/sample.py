"""Samples in corelens' interchange format (JSON Lines) and the strict reader that checks them.

One JSON object per line; paths are relative to the file's folder. See README.md#sample-format.
Every bad record is an error naming file, line, sample and field (docs/methods.md#layout): a bad target
must never turn into a silent zero later on.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from corelens.data import jsonfile
from corelens.errors import InputError, OptionError

Box = tuple[float, float, float, float]

TARGET_KINDS = ("box", "image", "tube")
DEFAULT_TASK = "default"

_RECORD_KEYS = frozenset({"id", "task", "question", "images", "video", "answer", "choices", "targets"})
_VIDEO_KEYS = frozenset({"frames", "path", "fps", "max_frames"})
_TARGET_KEYS = frozenset({"image", "box", "frames", "boxes"})
_TARGET_FORMS = "expected {image, box}, {image} or {frames, boxes}"
# Tolerance when matching decoded frame times to the sampling grid (float time bases).
_TIME_EPS = 1e-6
# Sampling rates beyond this are not a video's: the decoder could never deliver them, and a grid that fine
# only costs memory (docs/methods.md#resource-limits).
MAX_FPS = 1000.0
MAX_LINE_BYTES = 16 << 20  # one record names its images by path: kilobytes; a longer line is refused unread


@dataclass(frozen=True)
class Limits:
    """Resource bounds on one sample, checked from file headers before anything is decoded.

    `max_pixels` bounds each image, page or frame (width x height from the header). The default, 64 million
    (8000 x 8000), is above a 600 dpi scan of an A4 page (4960 x 7016, 35 M) and an 8K frame (33 M), and
    keeps one decoded RGB image under 200 MB. `max_pages` bounds the images / pages / decoded video frames
    of one sample: 1,000 pages run on the bundled model; each page adds visual tokens to one prompt.
    Raise them with `--max-pixels` / `--max-pages` or `read_samples(..., limits=Limits(...))`.
    """

    max_pixels: int = 64_000_000
    max_pages: int = 1000

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_pages"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise OptionError(f"{name} must be a positive integer, got {value!r}")

    def check_pixels(self, size: tuple[int, int], path: Path) -> str | None:
        """Return why an image of `size` (from its header) is refused, or None when within the bound."""
        pixels = size[0] * size[1]
        if pixels <= self.max_pixels:
            return None
        return (
            f"image {path} is {size[0]}x{size[1]} = {pixels:,} pixels, above the limit of "
            f"{self.max_pixels:,} (raise it with --max-pixels or Limits(max_pixels=...))"
        )

    def check_pages(self, count: int, what: str) -> str | None:
        """Return why `count` pages / frames in one sample are refused, or None when within the bound."""
        if count <= self.max_pages:
            return None
        return (
            f"{count:,} {what} in one sample, above the limit of {self.max_pages:,} "
            f"(raise it with --max-pages or Limits(max_pages=...))"
        )


@dataclass(frozen=True)
class Target:
    """Where the evidence is: a box on an image, a whole image / page, or a tube over video frames."""

    kind: str
    image: int | None = None
    box: Box | None = None
    frames: tuple[int, ...] | None = None
    boxes: tuple[Box, ...] | None = None

    def __post_init__(self) -> None:
        # The reader only builds valid targets; this catches code that builds them by hand.
        shapes = {
            "box": (True, True, False, False),
            "image": (True, False, False, False),
            "tube": (False, False, True, True),
        }
        if self.kind not in shapes:
            raise ValueError(f"target kind must be one of {TARGET_KINDS}, got {self.kind!r}")
        present = (
            self.image is not None,
            self.box is not None,
            self.frames is not None,
            self.boxes is not None,
        )
        if present != shapes[self.kind]:
            raise ValueError(f"a {self.kind!r} target has the wrong fields set: {self!r}")
        if self.kind == "tube" and len(self.frames or ()) != len(self.boxes or ()):
            raise ValueError("a tube target needs one box per frame")

    def to_json(self) -> dict[str, Any]:
        """Return the interchange-format dict of this target."""
        if self.kind == "box":
            return {"image": self.image, "box": list(self.box or ())}
        if self.kind == "image":
            return {"image": self.image}
        return {"frames": list(self.frames or ()), "boxes": [list(b) for b in self.boxes or ()]}


@dataclass(frozen=True)
class Video:
    """A video input: either a list of frame images or a video file sampled at `fps`."""

    frames: tuple[Path, ...] | None
    path: Path | None
    fps: float
    max_frames: int | None = None

    def to_json(self, relative_to: Path) -> dict[str, Any]:
        """Return the interchange-format dict with paths relative to `relative_to`."""
        if self.frames is not None:
            return {"frames": [_relative(p, relative_to) for p in self.frames], "fps": self.fps}
        out: dict[str, Any] = {"path": _relative(self.path, relative_to), "fps": self.fps}
        if self.max_frames is not None:
            out["max_frames"] = self.max_frames
        return out


@dataclass(frozen=True)
class Sample:
    """One checked sample: visual inputs, question, optional answer / choices and target locations."""

    id: str
    task: str
    question: str
    images: tuple[Path, ...] = ()
    video: Video | None = None
    answer: str | None = None
    choices: tuple[str, ...] | None = None
    targets: tuple[Target, ...] = ()
    image_sizes: tuple[tuple[int, int], ...] = ()
    frame_sizes: tuple[tuple[int, int], ...] = ()
    source: str = ""
    line: int = 0
    # A dict cannot be hashed; leave it out of the hash so samples stay usable as dict keys.
    meta: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_json(self, relative_to: Path | str) -> dict[str, Any]:
        """Return the interchange-format dict, paths relative to the folder `relative_to`."""
        folder = Path(relative_to)
        out: dict[str, Any] = {"id": self.id, "task": self.task}
        if self.images:
            out["images"] = [_relative(p, folder) for p in self.images]
        if self.video is not None:
            out["video"] = self.video.to_json(folder)
        out["question"] = self.question
        if self.answer is not None:
            out["answer"] = self.answer
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if self.targets:
            out["targets"] = [t.to_json() for t in self.targets]
        # meta holds the unknown keys only; never let it override a known field.
        out.update({k: v for k, v in self.meta.items() if k not in out})
        return out


@dataclass(frozen=True)
class SkippedSample:
    """A bad record left out by `read_samples(..., skip_bad=True)`, with the reason."""

    file: str
    line: int
    sample_id: str | None
    field: str | None
    error: str

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        return asdict(self)


class _Bad(Exception):
    """A problem in one record; turned into an InputError with file, line and sample id."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.message, self.field = message, field


class _ImageChecker:
    """Opens each image file once per read and remembers its size or why it is unreadable."""

    def __init__(self, limits: Limits) -> None:
        self._seen: dict[Path, tuple[int, int] | str] = {}
        self.limits = limits

    def size(self, path: Path, where: str) -> tuple[int, int]:
        """Return (width, height) from the file header, or raise _Bad naming `where`."""
        if path not in self._seen:
            self._seen[path] = _probe_image(path, self.limits)
        got = self._seen[path]
        if isinstance(got, str):
            raise _Bad(got, where)
        return got


def _probe_image(path: Path, limits: Limits) -> tuple[int, int] | str:
    """Return the image size, or a message saying why the file is not a readable image or too large."""
    if not path.exists():
        return f"file not found: {path}"
    if not path.is_file():
        return f"not a file: {path}"
    try:
        # Image.open reads the header only; verify() checks the chunks without decoding the pixels.
        with Image.open(path) as im:
            size = (int(im.size[0]), int(im.size[1]))
            too_large = limits.check_pixels(size, path)
            if too_large:
                return too_large
            im.verify()
    except Exception as exc:  # PIL raises many types (OSError, SyntaxError, struct.error, ...)
        return f"not a readable image: {path} ({type(exc).__name__}: {exc})"
    return size


def _json_type(value: Any) -> str:
    """Name a value's JSON type for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is_number(value: Any) -> bool:
    """True for a finite int or float; JSON booleans are not numbers."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _relative(path: Path | None, folder: Path) -> str:
    """Return `path` relative to `folder` in POSIX form (absolute when no relative path exists)."""
    assert path is not None
    try:
        return Path(os.path.relpath(path, folder)).as_posix()
    except ValueError:  # different drives on Windows
        return Path(path).as_posix()


def _resolve(base: Path, raw: str) -> Path:
    """Resolve a path from the file relative to its folder; abspath keeps symlinks as written."""
    return Path(os.path.abspath(base / raw))


def _required_str(obj: Mapping[str, Any], key: str) -> str:
    """Return a required non-empty string field."""
    if key not in obj:
        raise _Bad(f"missing required field {key!r}", key)
    value = obj[key]
    if not isinstance(value, str):
        raise _Bad(f"{key!r} must be a string, got {_json_type(value)}", key)
    if not value.strip():
        raise _Bad(f"{key!r} must not be empty", key)
    return value


def _optional_str(obj: Mapping[str, Any], key: str, *, non_empty: bool) -> str | None:
    """Return an optional string field; absent or null gives None."""
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{key!r} must be a string, got {_json_type(value)}", key)
    if non_empty and not value.strip():
        raise _Bad(f"{key!r} must not be empty", key)
    return value


def _str_list(value: Any, where: str, *, allow_empty: bool) -> list[str]:
    """Check a JSON array of non-empty strings."""
    if not isinstance(value, list):
        raise _Bad(f"{where!r} must be an array of strings, got {_json_type(value)}", where)
    if not value and not allow_empty:
        raise _Bad(f"{where!r} must not be empty", where)
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _Bad(f"must be a string, got {_json_type(item)}", f"{where}[{i}]")
        if not item:
            raise _Bad("must not be an empty string", f"{where}[{i}]")
    return value


class _RecordParser:
    """Checks records of one file: resolves paths, reads image headers and tracks ids."""

    def __init__(self, base: Path, limits: Limits) -> None:
        self.base = base
        self.limits = limits
        self.images = _ImageChecker(limits)
        self.seen_ids: dict[str, int] = {}

    def parse(self, obj: Any, source: str, line: int) -> Sample:
        """Return a checked Sample or raise _Bad naming the field."""
        if not isinstance(obj, dict):
            raise _Bad(f"a record must be a JSON object, got {_json_type(obj)}", None)
        sample_id = _required_str(obj, "id")
        if sample_id in self.seen_ids:
            raise _Bad(f"duplicate id {sample_id!r}; first used on line {self.seen_ids[sample_id]}", "id")
        question = _required_str(obj, "question")
        task = _optional_str(obj, "task", non_empty=True) or DEFAULT_TASK
        answer = _optional_str(obj, "answer", non_empty=False)
        images, image_sizes = self._images(obj.get("images"))
        video, frame_sizes = self._video(obj.get("video"))
        if not images and video is None:
            raise _Bad("a sample needs at least one visual input: non-empty 'images' or a 'video'", "images")
        choices = self._choices(obj.get("choices"))
        if answer is not None and choices is not None and answer not in choices:
            raise _Bad(f"answer {answer!r} is not one of the choices {list(choices)!r}", "answer")
        targets = self._targets(obj.get("targets"), image_sizes, video, frame_sizes)
        return Sample(
            id=sample_id,
            task=task,
            question=question,
            images=images,
            video=video,
            answer=answer,
            choices=choices,
            targets=targets,
            image_sizes=image_sizes,
            frame_sizes=frame_sizes,
            source=source,
            line=line,
            meta={k: v for k, v in obj.items() if k not in _RECORD_KEYS},
        )

    def _images(self, raw: Any) -> tuple[tuple[Path, ...], tuple[tuple[int, int], ...]]:
        """Check `images` and read each image's size."""
        if raw is None:
            return (), ()
        names = _str_list(raw, "images", allow_empty=True)
        too_many = self.limits.check_pages(len(names), "images")
        if too_many:
            # Before any header is read: 10,000 pages must not cost 10,000 file opens first.
            raise _Bad(too_many, "images")
        paths = tuple(_resolve(self.base, n) for n in names)
        sizes = tuple(self.images.size(p, f"images[{i}]") for i, p in enumerate(paths))
        return paths, sizes

    def _video(self, raw: Any) -> tuple[Video | None, tuple[tuple[int, int], ...]]:
        """Check `video`: frames (each a readable image) or an existing file, and a positive fps."""
        if raw is None:
            return None, ()
        if not isinstance(raw, dict):
            raise _Bad(f"'video' must be an object, got {_json_type(raw)}", "video")
        unknown = sorted(set(raw) - _VIDEO_KEYS)
        if unknown:
            raise _Bad(f"unknown video key(s) {unknown}; allowed: {sorted(_VIDEO_KEYS)}", "video")
        if ("frames" in raw) == ("path" in raw):
            raise _Bad("'video' needs exactly one of 'frames' (a list of images) or 'path' (a file)", "video")
        if "fps" not in raw:
            raise _Bad("missing 'fps'", "video.fps")
        fps = raw["fps"]
        if not _is_number(fps):
            raise _Bad(f"fps must be a finite number, got {_json_type(fps)} {fps!r}", "video.fps")
        if not 0 < fps <= MAX_FPS:
            # A non-positive rate samples nothing; one above MAX_FPS only inflates the sampling grid.
            raise _Bad(f"fps must be > 0 and <= {MAX_FPS:g}, got {fps!r}", "video.fps")
        if "frames" in raw:
            if "max_frames" in raw:
                # Tube indices point into the listed frames; sub-sampling them would shift those indices.
                raise _Bad(
                    "'max_frames' applies to a 'path' video only; list the frames to use", "video.max_frames"
                )
            names = _str_list(raw["frames"], "video.frames", allow_empty=False)
            too_many = self.limits.check_pages(len(names), "video frames")
            if too_many:
                raise _Bad(too_many, "video.frames")
            frames = tuple(_resolve(self.base, n) for n in names)
            sizes = tuple(self.images.size(p, f"video.frames[{i}]") for i, p in enumerate(frames))
            return Video(frames=frames, path=None, fps=float(fps)), sizes
        name = raw["path"]
        if not isinstance(name, str) or not name:
            raise _Bad(f"'path' must be a non-empty string, got {_json_type(name)}", "video.path")
        path = _resolve(self.base, name)
        if not path.is_file():
            raise _Bad(f"video file not found: {path}", "video.path")
        max_frames = raw.get("max_frames")
        if max_frames is not None and (not _is_int(max_frames) or max_frames <= 0):
            raise _Bad(f"max_frames must be a positive integer, got {max_frames!r}", "video.max_frames")
        too_many = self.limits.check_pages(max_frames or 0, "video frames (max_frames)")
        if too_many:
            raise _Bad(too_many, "video.max_frames")
        return Video(frames=None, path=path, fps=float(fps), max_frames=max_frames), ()

    @staticmethod
    def _choices(raw: Any) -> tuple[str, ...] | None:
        """Check `choices`: a non-empty list of distinct strings."""
        if raw is None:
            return None
        choices = _str_list(raw, "choices", allow_empty=False)
        for i, choice in enumerate(choices):
            if choice in choices[:i]:
                raise _Bad(f"duplicate choice {choice!r}", f"choices[{i}]")
        return tuple(choices)

    def _targets(
        self,
        raw: Any,
        image_sizes: tuple[tuple[int, int], ...],
        video: Video | None,
        frame_sizes: tuple[tuple[int, int], ...],
    ) -> tuple[Target, ...]:
        """Check every target against the sample's images and video."""
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise _Bad(f"'targets' must be an array, got {_json_type(raw)}", "targets")
        return tuple(
            _parse_target(t, f"targets[{i}]", image_sizes, video, frame_sizes) for i, t in enumerate(raw)
        )


def _parse_target(
    raw: Any,
    where: str,
    image_sizes: tuple[tuple[int, int], ...],
    video: Video | None,
    frame_sizes: tuple[tuple[int, int], ...],
) -> Target:
    """Check one target: its shape, indices in range and boxes inside their image or frame."""
    if not isinstance(raw, dict):
        raise _Bad(f"a target must be an object ({_TARGET_FORMS}), got {_json_type(raw)}", where)
    keys = set(raw)
    unknown = sorted(keys - _TARGET_KEYS)
    if unknown:
        raise _Bad(f"unknown target key(s) {unknown}; {_TARGET_FORMS}", where)
    if keys & {"frames", "boxes"}:
        if keys & {"image", "box"}:
            raise _Bad(f"a target mixes image and tube keys; {_TARGET_FORMS}", where)
        return _parse_tube(raw, where, video, frame_sizes)
    if "image" not in keys:
        raise _Bad(f"a target needs 'image' (the image / page index); {_TARGET_FORMS}", f"{where}.image")
    index = raw["image"]
    if not _is_int(index):
        raise _Bad(f"image must be an integer index, got {_json_type(index)} {index!r}", f"{where}.image")
    if not 0 <= index < len(image_sizes):
        raise _Bad(
            f"image index {index} out of range: the sample has {len(image_sizes)} image(s)", f"{where}.image"
        )
    if "box" not in keys:
        return Target(kind="image", image=index)
    box = _parse_box(raw["box"], f"{where}.box", image_sizes[index], f"image {index}")
    return Target(kind="box", image=index, box=box)


def _parse_tube(
    raw: Mapping[str, Any], where: str, video: Video | None, frame_sizes: tuple[tuple[int, int], ...]
) -> Target:
    """Check a tube: frame indices into the sample's video frames and one box per frame."""
    if "frames" not in raw:
        raise _Bad("a tube target needs 'frames' (frame indices), one per box", f"{where}.frames")
    if "boxes" not in raw:
        raise _Bad("a tube target needs 'boxes', one box per listed frame", f"{where}.boxes")
    if video is None:
        raise _Bad("a tube target needs a 'video' in the sample", f"{where}.frames")
    frames, boxes = raw["frames"], raw["boxes"]
    if not isinstance(frames, list) or not frames:
        raise _Bad(f"'frames' must be a non-empty array of frame indices, got {frames!r}", f"{where}.frames")
    if not isinstance(boxes, list):
        raise _Bad(f"'boxes' must be an array of boxes, got {_json_type(boxes)}", f"{where}.boxes")
    if len(boxes) != len(frames):
        raise _Bad(f"the tube lists {len(frames)} frame(s) but {len(boxes)} box(es)", f"{where}.boxes")
    # A path video is not decoded here: its frame count is known only through max_frames, and its
    # frame size not at all; those checks are left to whoever decodes it.
    count = len(video.frames) if video.frames is not None else video.max_frames
    for j, f in enumerate(frames):
        if not _is_int(f):
            raise _Bad(f"frame index must be an integer, got {_json_type(f)} {f!r}", f"{where}.frames[{j}]")
        if f < 0 or (count is not None and f >= count):
            raise _Bad(
                f"frame index {f} out of range: the video has {count} frame(s)", f"{where}.frames[{j}]"
            )
        if f in frames[:j]:
            raise _Bad(f"frame {f} is listed twice", f"{where}.frames[{j}]")
    parsed = tuple(
        _parse_box(b, f"{where}.boxes[{j}]", frame_sizes[f] if frame_sizes else None, f"frame {f}")
        for j, (f, b) in enumerate(zip(frames, boxes))
    )
    return Target(kind="tube", frames=tuple(frames), boxes=parsed)


def _parse_box(raw: Any, where: str, size: tuple[int, int] | None, what: str) -> Box:
    """Check a box [x0, y0, x1, y1]: 4 numbers, positive area, inside a `size` image when known."""
    if not isinstance(raw, list) or len(raw) != 4 or not all(_is_number(v) for v in raw):
        raise _Bad(f"a box must be [x0, y0, x1, y1] (4 finite numbers), got {raw!r}", where)
    x0, y0, x1, y1 = (float(v) for v in raw)
    if x1 <= x0 or y1 <= y0:
        raise _Bad(f"empty or inverted box {raw!r}: need x1 > x0 and y1 > y0", where)
    if size is not None:
        width, height = size
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            raise _Bad(f"box {raw!r} lies outside {what} ({width}x{height} pixels)", where)
    return (x0, y0, x1, y1)


def _decode_line(raw: bytes, line: int) -> str:
    """Decode one line as UTF-8 (a BOM on the first line is allowed)."""
    try:
        return raw.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(f"not valid UTF-8: {exc}", None) from None


def _lines(handle) -> Iterable[bytes | None]:
    """Yield the lines of the binary `handle`, None for a line over `MAX_LINE_BYTES` (read past in pieces,
    never held whole)."""
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        if len(raw) <= MAX_LINE_BYTES:
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):
            raw = handle.readline(MAX_LINE_BYTES)
        yield None


def _reject_constant(name: str) -> Any:
    """Refuse NaN / Infinity, which Python's json accepts but JSON does not."""
    raise ValueError(f"{name} is not valid JSON")


def _record_id(obj: Any) -> str | None:
    """Return the record's id for messages when it is readable."""
    if isinstance(obj, dict) and isinstance(obj.get("id"), str) and obj["id"].strip():
        return obj["id"]
    return None


def task_of(samples: Sequence[Sample], data: str | Path) -> str:
    """Return the task of a run's data: the samples' one `task`, else (none given, or several) the file's stem.

    The random controls of ablate and hybrid are seeded by it, so that every task gets its own draws.

    Examples:
        >>> task_of([Sample(id="a", task="image", question="q")], "eval/x.jsonl")
        'image'
        >>> task_of([Sample(id="a", task=DEFAULT_TASK, question="q")], "eval/chart-qa.jsonl")
        'chart-qa'
    """
    named = {s.task for s in samples} - {DEFAULT_TASK}
    # Samples that name one task: that task; none or several: the file, which then stands for the task.
    return (
        named.pop() if len(named) == 1 and all(s.task != DEFAULT_TASK for s in samples) else Path(data).stem
    )


def read_samples(
    path: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    limit: int | None = None,
    limits: Limits | None = None,
) -> tuple[list[Sample], list[SkippedSample]]:
    """Read and check a JSONL sample file; a bad record raises InputError, or is listed if `skip_bad`.

    `limits` bounds each sample's pixels and pages from the file headers (`Limits()`: the defaults).

    Examples:
        >>> from corelens.organism.tasks import generate
        >>> path = generate("image", getfixture("tmp_path"), 2, seed=1)  # the organism's image task
        >>> samples, skipped = read_samples(path)
        >>> s = samples[0]
        >>> s.id, s.question, s.answer, s.targets[0].box
        ('image-00000', 'what shape is the green object ?', 'green cross', (31.0, 86.0, 55.0, 110.0))
        >>> with open(path, "a") as f:
        ...     print('{"id": "bad", "images": ["img/missing.png"], "question": "what colour?"}', file=f)
        >>> samples, skipped = read_samples(path, skip_bad=True)
        >>> len(samples), skipped[0].line, skipped[0].field
        (2, 3, 'images[0]')
    """
    if limit is not None and (not _is_int(limit) or limit < 0):
        raise OptionError(f"limit must be a non-negative integer or None, got {limit!r}")
    source = str(path)
    file_path = Path(path)
    if not file_path.exists():
        raise InputError("sample file not found", file=source)
    if not file_path.is_file():
        inside = sorted(file_path.glob("*.jsonl")) if file_path.is_dir() else []
        hint = f"; it holds {inside[0].name}: give {inside[0]}" if inside else ""
        raise InputError(f"sample file is not a regular file{hint}", file=source)
    parser = _RecordParser(Path(os.path.abspath(file_path.parent)), limits or Limits())
    samples: list[Sample] = []
    skipped: list[SkippedSample] = []
    if limit == 0:
        return samples, skipped
    try:
        handle = file_path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot open sample file: {exc}", file=source) from None
    with handle:
        for line, raw in enumerate(_lines(handle), start=1):
            obj: Any = None
            try:
                if raw is None:
                    raise _Bad(f"invalid JSON: the line is longer than {MAX_LINE_BYTES} bytes", None)
                text = _decode_line(raw, line)
                if not text.strip():
                    continue
                try:  # a repeated key, a line over the size bound or nesting too deep: one line
                    obj = jsonfile.parse(text, max_bytes=MAX_LINE_BYTES, parse_constant=_reject_constant)
                except ValueError as exc:
                    raise _Bad(f"invalid JSON: {exc}", None) from None
                sample = parser.parse(obj, source, line)
            except _Bad as bad:
                error = InputError(
                    bad.message, file=source, line=line, sample=_record_id(obj), field=bad.field
                )
                if not skip_bad:
                    raise error from None
                skipped.append(SkippedSample(source, line, _record_id(obj), bad.field, str(error)))
                continue
            parser.seen_ids[sample.id] = line
            samples.append(sample)
            if limit is not None and len(samples) >= limit:
                break
    return samples, skipped


def write_samples(path: str | os.PathLike[str], samples: Iterable[Mapping[str, Any]]) -> int:
    """Write interchange-format dicts as JSON Lines (creating the folder); return the count written."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with out.open("w", encoding="utf-8") as handle:
        for record in samples:
            # allow_nan=False: the reader refuses NaN, so never write it.
            handle.write(json.dumps(dict(record), ensure_ascii=False, allow_nan=False) + "\n")
            count += 1
    return count


def _open_rgb(path: Path, sample: Sample, where: str, size: tuple[int, int] | None) -> Image.Image:
    """Load one image file as RGB, or raise InputError naming the sample and field.

    `size` is the header size the reader checked against `Limits.max_pixels`; the header is read again
    before decoding, so that a file replaced since (or a hand-built sample) is never decoded unbounded.
    """
    try:
        with Image.open(path) as im:
            found = (int(im.size[0]), int(im.size[1]))
            if size is not None and found != tuple(size):
                raise InputError(
                    f"image {path} is {found[0]}x{found[1]} but was {size[0]}x{size[1]} when read; "
                    "read the samples again",
                    **_where(sample, where),
                )
            if size is None and (too_large := Limits().check_pixels(found, path)):
                raise InputError(too_large, **_where(sample, where))
            return im.convert("RGB")
    except InputError:
        raise
    except Exception as exc:  # PIL raises many types; any of them means the file is unusable
        raise InputError(
            f"cannot read image {path}: {type(exc).__name__}: {exc}", **_where(sample, where)
        ) from None


def _known(sizes: tuple[tuple[int, int], ...], i: int) -> tuple[int, int] | None:
    """The header size recorded by the reader for input `i`, or None for a hand-built sample."""
    return sizes[i] if i < len(sizes) else None


def _where(sample: Sample, where: str) -> dict[str, Any]:
    """Keyword arguments locating a sample's field for InputError."""
    return {"file": sample.source or None, "line": sample.line or None, "sample": sample.id, "field": where}


def load_images(sample: Sample) -> list[Image.Image]:
    """Load the sample's images as RGB, in order (no EXIF rotation: boxes refer to the stored pixels)."""
    return [
        _open_rgb(p, sample, f"images[{i}]", _known(sample.image_sizes, i))
        for i, p in enumerate(sample.images)
    ]


def load_video(sample: Sample) -> tuple[list[Image.Image], list[float]]:
    """Load the sample's video frames as RGB images with each frame's time in seconds."""
    video = sample.video
    if video is None:
        raise InputError("the sample has no video", **_where(sample, "video"))
    if video.frames is not None:
        frames = [
            _open_rgb(p, sample, f"video.frames[{i}]", _known(sample.frame_sizes, i))
            for i, p in enumerate(video.frames)
        ]
        return frames, [i / video.fps for i in range(len(frames))]
    return _decode_video(sample, video)


def sample_times(duration: float, fps: float, max_frames: int | None) -> list[float]:
    """Times (s) to sample a `duration`-second video at `fps`, thinned uniformly to `max_frames`.

    Only the kept times are computed (grid point k is at k / fps), never the whole grid: a long clip at a
    high rate stays as cheap as its `max_frames`.
    """
    count = max(1, math.ceil(duration * fps - _TIME_EPS))
    if max_frames is None or count <= max_frames:
        return [k / fps for k in range(count)]
    if max_frames == 1:
        return [0.0]
    # Evenly spaced over the whole clip, first and last grid points included.
    return [round(i * (count - 1) / (max_frames - 1)) / fps for i in range(max_frames)]


def _check_video_grid(duration: float, video: Video, where: dict[str, Any]) -> None:
    """Refuse a duration that is not a finite non-negative number, or a grid above `Limits.max_pages`."""
    if not (math.isfinite(duration) and duration >= 0):
        raise InputError(f"video {video.path} reports a duration of {duration!r} s", **where)
    if video.max_frames is not None:
        return  # the reader bounded max_frames already
    count = math.ceil(duration * video.fps - _TIME_EPS)
    bound = Limits().max_pages
    if count > bound:
        # The duration is known only once the file is open, after the reader's limits are gone.
        raise InputError(
            f"{duration:g} s at {video.fps:g} fps is {count:,} frames, above {bound:,}; "
            "set video.max_frames to sample fewer frames evenly",
            **{**where, "field": "video.max_frames"},
        )


def _decode_video(sample: Sample, video: Video) -> tuple[list[Image.Image], list[float]]:
    """Decode a `path` video with PyAV at the sampling times; return frames and their true times."""
    where = _where(sample, "video.path")
    try:
        import av
    except ImportError:
        raise InputError("decoding a 'path' video needs PyAV: pip install av", **where) from None
    try:
        duration = _video_duration(av, video.path)
        _check_video_grid(duration, video, where)
        wanted = sample_times(duration, video.fps, video.max_frames)
        frames: list[Image.Image] = []
        times: list[float] = []
        with av.open(str(video.path)) as container:
            stream = container.streams.video[0]
            start = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
            rate = float(stream.average_rate or video.fps)
            j = 0
            for k, frame in enumerate(container.decode(stream)):
                if j >= len(wanted):
                    break
                t = (float(frame.time) - start) if frame.time is not None else k / rate
                if t + _TIME_EPS < wanted[j]:
                    continue
                # The first frame at or after each wanted time; one frame never fills two slots.
                frames.append(frame.to_image().convert("RGB"))
                times.append(t)
                while j < len(wanted) and wanted[j] <= t + _TIME_EPS:
                    j += 1
    except InputError:
        raise
    except Exception as exc:  # av raises its own FFmpegError tree plus IndexError for no stream
        raise InputError(f"cannot decode video {video.path}: {type(exc).__name__}: {exc}", **where) from None
    if not frames:
        raise InputError(f"no frames decoded from {video.path}", **where)
    return frames, times


def _video_duration(av: Any, path: Path | None) -> float:
    """Duration in seconds from the stream or container header, else from the last packet time."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration and stream.time_base:
            return float(stream.duration * stream.time_base)
        if container.duration:
            return container.duration / av.time_base
        # No header duration (some raw or streamed files): scan packet times without decoding.
        start = stream.start_time or 0
        end = 0.0
        for packet in container.demux(stream):
            if packet.pts is not None and packet.time_base is not None:
                end = max(end, float((packet.pts - start + (packet.duration or 0)) * packet.time_base))
        return end
