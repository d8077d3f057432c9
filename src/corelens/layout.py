"""Where visual evidence sits in the prompt: segments of visual tokens and the target set Omega (METHODS §1).

A `Segment` is one grid of visual tokens (an image, a tile, a view, a video frame group, a page) with its
token span and the geometry that maps original pixels to grid cells. A `Layout` is all segments of one
prompt; `Layout.omega(targets)` turns ground-truth targets into token positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from corelens.data.sample import Target
from corelens.errors import InputError

OVERLAP_RULES = ("any", "centre", "coverage")


@dataclass(frozen=True)
class Segment:
    """One grid of visual tokens: `rows` x `cols` cells over an image of `orig_size` (all of it, or `region`)."""

    kind: str  # "image" or "video"
    source: int  # index of the image in the sample (or of the video)
    start: int  # first token position
    rows: int
    cols: int
    orig_size: tuple[int, int]  # (width, height) of the original image or frame, in pixels
    frames: tuple[int, ...] = ()  # video: indices of the sample's frames in this group
    time_span: tuple[float, float] | None = None  # video: [start, end) in seconds
    view: str = "full"
    row_newline: bool = False  # a pixel-less newline token ends every row (LLaVA-NeXT / OneVision)
    # The rectangle of original pixels (x0, y0, x1, y1) the grid covers, when it is not the whole image: a
    # centre crop covers less, padding to a square more (cells outside the image hold padding).
    region: tuple[float, float, float, float] | None = None
    trailing: int = 0  # pixel-less tokens after the grid (LLaVA-OneVision: one newline after a video / image)

    @property
    def row_stride(self) -> int:
        """Return the number of tokens per grid row, newline included."""
        return self.cols + int(self.row_newline)

    @property
    def end(self) -> int:
        """Return one past the last token position of the segment."""
        return self.start + self.rows * self.row_stride + self.trailing

    def token(self, row: np.ndarray | int, col: np.ndarray | int) -> np.ndarray | int:
        """Return the token position of grid cell (row, col)."""
        return self.start + np.asarray(row) * self.row_stride + np.asarray(col)

    def pixel_tokens(self) -> np.ndarray:
        """Return the positions of the tokens that carry pixels (newline tokens excluded)."""
        r, c = np.meshgrid(np.arange(self.rows), np.arange(self.cols), indexing="ij")
        return np.sort(self.token(r, c).ravel())

    def all_tokens(self) -> np.ndarray:
        """Return every token position of the segment (newline tokens included)."""
        return np.arange(self.start, self.end)

    def cell_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the x and y cell edges in original pixels (cols + 1 and rows + 1 values)."""
        x0, y0, x1, y1 = self.region if self.region is not None else (0.0, 0.0, *self.orig_size)
        return np.linspace(x0, x1, self.cols + 1), np.linspace(y0, y1, self.rows + 1)

    def tokens_in_box(
        self, box: Sequence[float], rule: str = "any", tau: float = 0.5, *, sample: str | None = None
    ) -> np.ndarray:
        """Return the pixel tokens whose cell meets `box` (x0, y0, x1, y1, original pixels) under `rule`."""
        x0, y0, x1, y1 = (float(v) for v in box)
        xe, ye = self.cell_edges()
        ox = np.clip(np.minimum(xe[1:], x1) - np.maximum(xe[:-1], x0), 0.0, None)
        oy = np.clip(np.minimum(ye[1:], y1) - np.maximum(ye[:-1], y0), 0.0, None)
        if rule == "any":
            hit = (oy[:, None] > 0) & (ox[None, :] > 0)
        elif rule == "centre":
            cx, cy = (xe[:-1] + xe[1:]) / 2, (ye[:-1] + ye[1:]) / 2
            hit = ((cy >= y0) & (cy < y1))[:, None] & ((cx >= x0) & (cx < x1))[None, :]
        elif rule == "coverage":
            area = np.diff(ye)[:, None] * np.diff(xe)[None, :]
            hit = (oy[:, None] * ox[None, :]) / area >= tau
        else:
            raise InputError(f"unknown overlap rule {rule!r}; expected one of {OVERLAP_RULES}", sample=sample)
        r, c = np.nonzero(hit)
        return np.sort(np.asarray(self.token(r, c), dtype=np.int64).ravel())


@dataclass(frozen=True)
class Layout:
    """All visual segments of one prompt of `seq_len` tokens; `visual` = every visual token position."""

    segments: tuple[Segment, ...]
    seq_len: int

    @property
    def visual(self) -> np.ndarray:
        """Return the sorted positions of all visual tokens (newline tokens included, boundaries not)."""
        if not self.segments:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate([s.all_tokens() for s in self.segments]))

    def of(self, kind: str, source: int) -> list[Segment]:
        """Return the segments showing image (or video) `source`."""
        return [s for s in self.segments if s.kind == kind and s.source == source]

    def omega(
        self, targets: Sequence[Target], rule: str = "any", tau: float = 0.5, *, sample: str | None = None
    ) -> np.ndarray:
        """Return the sorted token positions of the target set Omega for `targets` (METHODS §1)."""
        parts = [np.zeros(0, dtype=np.int64)]
        for i, target in enumerate(targets):
            field = f"targets[{i}]"
            if target.kind in ("box", "image"):
                segments = self.of("image", target.image)
                if not segments:
                    raise InputError(
                        f"image {target.image} has no visual tokens in the prompt", sample=sample, field=field
                    )
                for seg in segments:
                    if target.kind == "image":
                        parts.append(seg.pixel_tokens())
                    else:
                        parts.append(seg.tokens_in_box(target.box, rule, tau, sample=sample))
            elif target.kind == "tube":
                parts.append(self._tube(target, rule, tau, sample=sample, field=field))
            else:
                raise InputError(f"unknown target kind {target.kind!r}", sample=sample, field=field)
        return np.unique(np.concatenate(parts))

    def _tube(self, target: Target, rule: str, tau: float, *, sample: str | None, field: str) -> np.ndarray:
        boxes = dict(zip(target.frames, target.boxes))
        first, last = min(boxes), max(boxes)
        annotated = sorted(boxes)
        parts = []
        for seg in (s for s in self.segments if s.kind == "video"):
            inside = [f for f in seg.frames if first <= f <= last]
            if not inside:
                continue
            group_boxes = [boxes[f] for f in inside if f in boxes]
            if not group_boxes:
                # A group between two annotated frames: use the boxes of its nearest annotated neighbours.
                before = max(f for f in annotated if f < inside[0])
                after = min(f for f in annotated if f > inside[-1])
                group_boxes = [boxes[before], boxes[after]]
            parts.extend(seg.tokens_in_box(b, rule, tau, sample=sample) for b in group_boxes)
        if not parts:
            raise InputError(
                f"tube over frames {first}..{last} overlaps no sampled frame group of the video",
                sample=sample,
                field=field,
            )
        return np.unique(np.concatenate(parts))
