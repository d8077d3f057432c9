"""Attention overlays: a head's attention over visual tokens drawn on the images, frames or pages it covers.

`write_overlays` draws where the top and bottom heads of a ranking look, measured by the caller
(`corelens.capture.attention_maps`: the per-key attention of chosen heads for one sample), on the sample's
pixels (`panels`, `overlay_figure`). Nothing here runs the model.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.collections import PatchCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from PIL import Image

from corelens.data.paths import inside, safe_name
from corelens.data.sample import Sample, load_images, load_video
from corelens.layout import Segment
from corelens.report.figure import DPI, plt, save_figure

if TYPE_CHECKING:
    from corelens.models.prepare import Prepared

# Longest side, in pixels, of the picture drawn under an overlay: a panel is about 2 inches wide at the
# figure's dpi, so more pixels add memory and nothing visible (a 12000 x 12000 image would take 430 MB).
OVERLAY_MAX_SIDE = 1024
# Sizes that keep the labels legible in the report: its figures are at most REPORT_WIDTH_PX wide (the page's
# 1100 px column less the figure's margins), so a figure of MAX_PANELS panels of PANEL_IN inches (plus the
# labels and colour bar, MARGIN_IN) at DPI is scaled by at most 1080 / 1152 there: LABEL_PT (15 px at 120 dpi)
# stays above MIN_LABEL_PX on the page.
REPORT_WIDTH_PX = 1080
MIN_LABEL_PX = 11
MAX_PANELS = 4
PANEL_IN = 2.0
MARGIN_IN = 1.6
LABEL_PT = 9
TITLE_PT = 10
# Outlines: cells under MIN_LEVEL of the figure's largest cell are not outlined; the largest gets MAX_LINE_PT.
MIN_LEVEL = 0.1
MAX_LINE_PT = 2.5


def preview(picture: Image.Image, size: tuple[int, int], max_side: int = OVERLAY_MAX_SIDE) -> Image.Image:
    """Return `picture` resized to `size` (width, height), scaled down so its longest side is <= max_side."""
    scale = min(1.0, max_side / max(size))
    target = (max(1, round(size[0] * scale)), max(1, round(size[1] * scale)))
    return picture if picture.size == target else picture.resize(target)


@dataclass
class Panel:
    """One picture of a prompt with the token grid that covers it and the target boxes drawn on it."""

    segment: Segment
    picture: Image.Image
    label: str
    boxes: list[tuple[float, float, float, float]] = field(default_factory=list)
    hit: bool = False  # holds (part of) the target


def token_grid(segment: Segment, attention: np.ndarray) -> np.ndarray:
    """Return the (rows, cols) grid of one segment's pixel tokens from a per-key attention vector."""
    rows, cols = np.meshgrid(np.arange(segment.rows), np.arange(segment.cols), indexing="ij")
    return attention[segment.token(rows, cols)]


def short_title(title: str, width_in: float, font_pt: float = TITLE_PT, lines: int = 2) -> str:
    """Return `title` wrapped to a figure `width_in` inches wide, at most `lines` lines (the rest cut with "...")."""
    chars = max(20, int(width_in * 72 / (0.6 * font_pt)))  # 0.6 em: a wide average glyph of DejaVu Sans
    wrapped = textwrap.wrap(title, chars, max_lines=lines, placeholder="...")
    return "\n".join(wrapped)


def outline_levels(grids: list[np.ndarray], floor: float = MIN_LEVEL) -> tuple[float, list[np.ndarray]]:
    """Return the largest cell of `grids` (shared by every head drawn) and each grid over it, 0 below `floor`.

    A cell's level is its share of the head's *whole* attention over the largest such share of any head and
    panel of the figure: a head that looks elsewhere (0 % on the pictures) has no outlined cell, a strong one
    has outlines as heavy as the figure's heaviest.

    Examples:
        >>> top, levels = outline_levels([np.array([[0.2, 0.1]]), np.array([[0.0, 0.01]])])
        >>> top, levels[0].tolist(), levels[1].tolist()
        (0.2, [[1.0, 0.5]], [[0.0, 0.0]])
    """
    top = max([float(g.max()) for g in grids if g.size] or [0.0])
    return top, [np.where(g >= floor * top, g / top, 0.0) if top > 0 else np.zeros_like(g) for g in grids]


def _outline_cells(ax, segment: Segment, levels: np.ndarray, max_pt: float) -> None:
    """Outline each cell of `levels` above 0 inside its own border: line weight and opacity grow with the level,
    a dark line under a yellow one so that it shows on light and dark pictures; inside, the picture's pixels
    are untouched."""
    xe, ye = segment.cell_edges()
    cells = [(r, c) for r, c in zip(*np.nonzero(levels))]
    if not cells:
        return
    boxes, widths, colours, halos = [], [], [], []
    for r, c in cells:
        v = float(levels[r, c])
        w, h = xe[c + 1] - xe[c], ye[r + 1] - ye[r]
        inset = 0.12  # of the cell: the lines lie in its border band, its middle keeps the picture
        boxes.append(
            Rectangle((xe[c] + inset * w, ye[r] + inset * h), (1 - 2 * inset) * w, (1 - 2 * inset) * h)
        )
        widths.append(max(0.4, max_pt * v))
        colours.append((1.0, 0.83, 0.0, 0.45 + 0.55 * v))
        halos.append((0.0, 0.0, 0.0, 0.45 + 0.55 * v))
    ax.add_collection(
        PatchCollection(boxes, facecolor="none", edgecolor=halos, linewidths=[2 * w for w in widths])
    )
    ax.add_collection(PatchCollection([Rectangle(b.get_xy(), b.get_width(), b.get_height()) for b in boxes],
                                      facecolor="none", edgecolor=colours, linewidths=widths))  # fmt: skip


def overlay_grid(panels: list[Panel], heads: list[tuple[str, np.ndarray]], *, title: str = "") -> plt.Figure:
    """Return the heads x panels figure of `overlay_figure`, laid out but not saved (tests read its text)."""
    panels = panels[:MAX_PANELS]  # wider, the report would scale its labels below MIN_LABEL_PX
    n_rows, n_cols = len(heads), max(1, len(panels))
    # Absolute: a cell's share of the head's whole attention (its query rows' attention sums to 1 over the
    # keys), on one scale for every head, so a head that looks at the text shows no outline at all.
    raw = [[token_grid(p.segment, attention) for p in panels] for _, attention in heads]
    top, flat = outline_levels([g for row in raw for g in row])
    levels = [flat[r * len(panels) : (r + 1) * len(panels)] for r in range(n_rows)]
    width = PANEL_IN * n_cols + MARGIN_IN
    # A row as tall as its tallest panel at PANEL_IN wide (wide frames, tall pages), plus its title's room.
    aspect = max([p.segment.orig_size[1] / max(1, p.segment.orig_size[0]) for p in panels] or [1.0])
    row_in = min(3.2, max(1.0, PANEL_IN * aspect + 0.35))
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(width, row_in * n_rows + 0.9), dpi=DPI, squeeze=False, layout="compressed"
    )
    for r, (name, _) in enumerate(heads):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            w, h = panel.segment.orig_size
            # Drawn in image coordinates (extent), from a bounded preview: never at full size.
            ax.imshow(preview(panel.picture, (w, h)), extent=(0, w, h, 0))
            xe, ye = panel.segment.cell_edges()
            # A line at most a quarter of a cell's width on the page, at most MAX_LINE_PT.
            cell_pt = PANEL_IN * 72 * (xe[-1] - xe[0]) / max(1, w) / max(1, panel.segment.cols)
            _outline_cells(ax, panel.segment, levels[r][c], min(MAX_LINE_PT, cell_pt / 8))
            ax.set_xlim(min(0, xe[0]), max(w, xe[-1]))
            ax.set_ylim(max(h, ye[-1]), min(0, ye[0]))
            for x0, y0, x1, y1 in panel.boxes:
                ax.add_patch(
                    Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="cyan", linewidth=1.5)
                )
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(
                    short_title(panel.label + (" (target)" if panel.hit else ""), PANEL_IN, LABEL_PT, 2),
                    fontsize=LABEL_PT,
                )
            if c == 0:  # a text at a fixed place: a y label moves at draw time, after the layout placed it
                here = float(sum(g.sum() for g in raw[r]))
                ax.text(-0.04, 0.5, f"{name}\n{100 * here:.0f} % on these pictures", transform=ax.transAxes,
                        rotation=90, ha="right", va="center", fontsize=LABEL_PT)  # fmt: skip
    if top > 0:
        handles = [Line2D([], [], color="#ffd400", lw=MAX_LINE_PT * v,
                          path_effects=[patheffects.withStroke(linewidth=2 * MAX_LINE_PT * v, foreground="black")])
                   for v in (1.0, 0.5, MIN_LEVEL)]  # fmt: skip
        labels = [f"{100 * v * top:.1f} %" for v in (1.0, 0.5, MIN_LEVEL)]
        fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=LABEL_PT, frameon=False,
                   title="outlined cell: its share of\nthe head's whole attention", title_fontsize=LABEL_PT)  # fmt: skip
    if title:
        fig.suptitle(short_title(title, width), fontsize=TITLE_PT)
    return fig


def overlay_figure(
    panels: list[Panel], heads: list[tuple[str, np.ndarray]], path: str | Path, *, title: str = ""
) -> Path:
    """Write a heads x panels grid: the cells each head attends, outlined over each picture (the picture's own
    colours stay inside the outlines); one scale for all heads, so a head that looks elsewhere shows none.

    At most `MAX_PANELS` panels, each `PANEL_IN` inches wide, labels at `LABEL_PT`: the figure is at most
    `REPORT_WIDTH_PX` wide in the report, so its labels are at least `MIN_LABEL_PX` tall there.
    """
    return save_figure(overlay_grid(panels, heads, title=title), path)


def panels(sample: Sample, prepared: Prepared, max_panels: int = MAX_PANELS) -> list[Panel]:
    """Return the pixel panels of a prompt (images, pages, first frame of each video frame group).

    Panels that hold a target come first, then the others in prompt order, at most `max_panels`.
    """
    images = load_images(sample) if sample.images else []
    frames = load_video(sample)[0] if sample.video is not None else []
    out = []
    for segment in prepared.layout.segments:
        boxes: list = []
        if segment.kind == "video":
            picture, label = frames[segment.frames[0]], f"frames {segment.frames[0]}-{segment.frames[-1]}"
            for target in sample.targets:
                if target.kind == "tube" and target.frames and target.boxes:
                    boxes += [b for f, b in zip(target.frames, target.boxes) if f in segment.frames][:1]
        else:
            picture, label = images[segment.source], f"image {segment.source}"
            if segment.view != "full":
                label += f" ({segment.view})"
            boxes = [t.box for t in sample.targets if t.image == segment.source and t.box is not None]
        page = any(t.kind == "image" and t.image == segment.source for t in sample.targets)
        hit = bool(boxes) or (segment.kind == "image" and page)
        # A bounded preview (OVERLAY_MAX_SIDE): the full-size pixels are not kept for drawing.
        small = preview(picture, segment.orig_size)
        out.append(Panel(segment, small, label, [tuple(b) for b in boxes], hit))
    out.sort(key=lambda p: not p.hit)
    return out[:max_panels]


def top_bottom(heads: pd.DataFrame, k: int = 3) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Return the `k` best and `k` worst ranked (layer, head) pairs of a head table."""
    ranked = heads.sort_values("rank")
    top = list(zip(ranked["layer"].head(k).astype(int), ranked["head"].head(k).astype(int)))
    bottom = list(zip(ranked["layer"].tail(k).astype(int), ranked["head"].tail(k).astype(int)))
    return top, bottom


def write_overlays(
    measured: Iterable[tuple[Sample, Prepared, dict[tuple[int, int], np.ndarray]]],
    top: list[tuple[int, int]],
    bottom: list[tuple[int, int]],
    folder: str | Path,
) -> list[Path]:
    """Draw the `top` and `bottom` heads' attention for each measured (sample, prepared prompt, maps); return
    the figure paths."""
    paths = []
    for sample, prepared, maps in measured:
        rows = [(f"top {i + 1}: L{lh[0]}H{lh[1]}", maps[lh]) for i, lh in enumerate(top)]
        rows += [(f"bottom: L{lh[0]}H{lh[1]}", maps[lh]) for lh in bottom]
        path = inside(folder, Path(folder) / f"overlay-{safe_name(sample.id)}.png")
        paths.append(
            overlay_figure(panels(sample, prepared), rows, path, title=f"{sample.id}: {sample.question}")
        )
    return paths
