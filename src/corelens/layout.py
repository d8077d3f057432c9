"""Where visual evidence sits in the prompt: segments of visual tokens and the target set Omega (docs/methods.md#layout).

A `Segment` is one grid of visual tokens (an image, a tile, a view, a video frame group, a page) with its
token span and the geometry that maps original pixels to grid cells. A `Layout` is all segments of one
prompt; `Layout.omega(targets)` turns ground-truth targets into token positions.

Cell geometry. By default a segment's cells split its `region` (or the whole image) evenly. Where the
vision tower does not tile its input exactly, the family module gives every column and row its own
original-pixel span (`col_spans`, `row_spans`): LLaVA-OneVision's SigLIP sees 27 patches of 14 pixels in
a 384-pixel tile (378 pixels; the last 6 reach no token), and where the model resizes a feature grid
bilinearly (OneVision's downsampled any-res grid, pooled video frames) a cell's span is the footprint of
the input features it interpolates, so neighbouring spans may overlap.

Padding cells (`PADDING_RULES`). A cell whose span lies wholly outside the image holds only padding
(LLaVA-1.5 with `do_pad`, LLaVA-OneVision's multi-image squares). Rule `"visual"` (the default): such a
cell's token counts in V (the model attends to it like any visual token, as it does to pixel-less newline
tokens) but never in Omega, not even for a whole-image target. `"omega"`: it also belongs to Omega of a
whole-image target (corelens' behaviour before the rule existed). `"none"`: it belongs to neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from corelens.data.sample import Target
from corelens.errors import InputError

OVERLAP_RULES = ("any", "centre", "coverage")
PADDING_RULES = ("visual", "omega", "none")


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
    # Explicit original-pixel spans (x0, x1) of every column and (y0, y1) of every row, where cells are not an
    # even split of `region` (a tower that leaves a strip of each tile unseen, a bilinearly resized grid).
    col_spans: tuple[tuple[float, float], ...] | None = None
    row_spans: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self) -> None:
        if self.col_spans is not None and len(self.col_spans) != self.cols:
            raise ValueError(f"{len(self.col_spans)} column spans for {self.cols} columns")
        if self.row_spans is not None and len(self.row_spans) != self.rows:
            raise ValueError(f"{len(self.row_spans)} row spans for {self.rows} rows")

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

    def cell_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """Return the original-pixel spans of the columns (cols x 2: x0, x1) and rows (rows x 2: y0, y1)."""
        x0, y0, x1, y1 = self.region if self.region is not None else (0.0, 0.0, *self.orig_size)

        def even(lo: float, hi: float, n: int) -> np.ndarray:
            edges = np.linspace(lo, hi, n + 1)
            return np.stack([edges[:-1], edges[1:]], axis=1)

        xs = (
            np.asarray(self.col_spans, dtype=np.float64)
            if self.col_spans is not None
            else even(x0, x1, self.cols)
        )
        ys = (
            np.asarray(self.row_spans, dtype=np.float64)
            if self.row_spans is not None
            else even(y0, y1, self.rows)
        )
        return xs, ys

    def cell_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Return x and y cell edges in original pixels (cols + 1 and rows + 1 values), for drawing.

        Exact for evenly split cells; with explicit spans, each cell's start and the last cell's end (a strip
        no token sees, or the overlap of bilinear footprints, is not shown).
        """
        xs, ys = self.cell_spans()
        return np.append(xs[:, 0], xs[-1, 1]), np.append(ys[:, 0], ys[-1, 1])

    def padding_cells(self) -> np.ndarray:
        """Return a rows x cols mask of the cells whose span lies wholly outside the image (padding only)."""
        xs, ys = self.cell_spans()
        w, h = self.orig_size
        out_x = (xs[:, 1] <= 0.0) | (xs[:, 0] >= w)
        out_y = (ys[:, 1] <= 0.0) | (ys[:, 0] >= h)
        return out_y[:, None] | out_x[None, :]

    def tokens(self, padding: str = "visual", *, role: str = "visual") -> np.ndarray:
        """Return the segment's tokens in V (`role="visual"`) or in a whole-image Omega (`role="omega"`).

        Padding-only cells follow the rule `padding` (module docstring); newline tokens are in V only.
        """
        if padding not in PADDING_RULES:
            raise InputError(f"unknown padding rule {padding!r}; expected one of {PADDING_RULES}")
        keep_padding = padding == "omega" or (padding == "visual" and role == "visual")
        kept = np.ones((self.rows, self.cols), bool) if keep_padding else ~self.padding_cells()
        r, c = np.nonzero(kept)
        cells = np.sort(np.asarray(self.token(r, c), dtype=np.int64).ravel())
        if role == "omega":
            return cells
        newlines = np.setdiff1d(self.all_tokens(), self.pixel_tokens())
        return np.union1d(cells, newlines)

    def tokens_in_box(
        self, box: Sequence[float], rule: str = "any", tau: float = 0.5, *, sample: str | None = None
    ) -> np.ndarray:
        """Return the pixel tokens whose cell meets `box` (x0, y0, x1, y1, original pixels) under `rule`."""
        x0, y0, x1, y1 = (float(v) for v in box)
        xs, ys = self.cell_spans()
        ox = np.clip(np.minimum(xs[:, 1], x1) - np.maximum(xs[:, 0], x0), 0.0, None)
        oy = np.clip(np.minimum(ys[:, 1], y1) - np.maximum(ys[:, 0], y0), 0.0, None)
        if rule == "any":
            hit = (oy[:, None] > 0) & (ox[None, :] > 0)
        elif rule == "centre":
            cx, cy = xs.mean(axis=1), ys.mean(axis=1)
            hit = ((cy >= y0) & (cy < y1))[:, None] & ((cx >= x0) & (cx < x1))[None, :]
        elif rule == "coverage":
            area = (ys[:, 1] - ys[:, 0])[:, None] * (xs[:, 1] - xs[:, 0])[None, :]
            hit = (oy[:, None] * ox[None, :]) / area >= tau
        else:
            raise InputError(f"unknown overlap rule {rule!r}; expected one of {OVERLAP_RULES}", sample=sample)
        r, c = np.nonzero(hit)
        return np.sort(np.asarray(self.token(r, c), dtype=np.int64).ravel())


@dataclass(frozen=True)
class Layout:
    """All visual segments of one prompt of `seq_len` tokens; `visual` = V, the visual token positions.

    `padding` is the padding-cell rule (`PADDING_RULES`, module docstring): `"visual"` by default.
    """

    segments: tuple[Segment, ...]
    seq_len: int
    padding: str = "visual"

    def __post_init__(self) -> None:
        if self.padding not in PADDING_RULES:
            raise InputError(f"unknown padding rule {self.padding!r}; expected one of {PADDING_RULES}")

    @property
    def visual(self) -> np.ndarray:
        """Return the sorted positions of V (newline tokens included, boundaries not; padding per the rule)."""
        if not self.segments:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate([s.tokens(self.padding) for s in self.segments]))

    def views(self) -> list[tuple[str, np.ndarray]]:
        """Return each view's label and its tokens in V, in prompt order (docs/methods.md#ram, RAM per view).

        A view is one segment: "image I" for an image shown whole (a page of a document is an image),
        "image I:VIEW" for one view of a tiled image (base, grid, tile R,C, thumbnail) and "video:frames A-B"
        for a frame group. Segments with the same label (none in the supported families) are merged.
        """
        tiled = {s.source for s in self.segments if s.kind == "image" and s.view != "full"}
        found: dict[str, list[np.ndarray]] = {}
        # A mask over positions, not intersect1d per segment: linear in the number of pages.
        in_visual = np.zeros(max([self.visual.max(initial=-1)] + [s.end for s in self.segments]) + 1, bool)
        in_visual[self.visual] = True
        for seg in sorted(self.segments, key=lambda s: s.start):
            if seg.kind == "video":
                label = f"video:frames {seg.frames[0]}-{seg.frames[-1]}" if seg.frames else "video"
            else:
                label = f"image {seg.source}" + (f":{seg.view}" if seg.source in tiled else "")
            tokens = np.asarray(seg.all_tokens())
            found.setdefault(label, []).append(np.unique(tokens[in_visual[tokens]]))
        return [(label, np.unique(np.concatenate(parts))) for label, parts in found.items()]

    def of(self, kind: str, source: int) -> list[Segment]:
        """Return the segments showing image (or video) `source`."""
        return [s for s in self.segments if s.kind == kind and s.source == source]

    def omega(
        self, targets: Sequence[Target], rule: str = "any", tau: float = 0.5, *, sample: str | None = None
    ) -> np.ndarray:
        """Return the sorted token positions of the target set Omega for `targets` (docs/methods.md#layout)."""
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
                        parts.append(seg.tokens(self.padding, role="omega"))
                    else:
                        parts.append(self._kept(seg, seg.tokens_in_box(target.box, rule, tau, sample=sample)))
            elif target.kind == "tube":
                parts.append(self._tube(target, rule, tau, sample=sample, field=field))
            else:
                raise InputError(f"unknown target kind {target.kind!r}", sample=sample, field=field)
        return np.unique(np.concatenate(parts))

    def _kept(self, seg: Segment, tokens: np.ndarray) -> np.ndarray:
        """Return `tokens` without padding-only cells unless the rule puts them in Omega."""
        if self.padding == "omega" or not len(tokens):
            return tokens
        return np.intersect1d(tokens, seg.tokens(self.padding, role="omega"))

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
            parts.extend(self._kept(seg, seg.tokens_in_box(b, rule, tau, sample=sample)) for b in group_boxes)
        if not parts:
            raise InputError(
                f"tube over frames {first}..{last} overlaps no sampled frame group of the video",
                sample=sample,
                field=field,
            )
        return np.unique(np.concatenate(parts))
