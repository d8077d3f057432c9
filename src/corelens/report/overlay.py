"""Attention overlays: a head's attention over visual tokens drawn on the images, frames or pages it covers.

`write_overlays` measures where the top and bottom heads of a ranking look (`attention_maps`: the per-key
attention of chosen heads for one sample) and draws it on the sample's pixels (`panels`, `overlay_figure`).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.patches import Rectangle
from PIL import Image

from corelens.attention import activate
from corelens.attention.probes import KeyMapProbe
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.paths import inside, safe_name
from corelens.data.sample import Sample, load_images, load_video
from corelens.layout import Segment
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare
from corelens.report.figure import DPI, plt, save_figure

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


def overlay_grid(panels: list[Panel], heads: list[tuple[str, np.ndarray]], *, title: str = "") -> plt.Figure:
    """Return the heads x panels figure of `overlay_figure`, laid out but not saved (tests read its text)."""
    panels = panels[:MAX_PANELS]  # wider, the report would scale its labels below MIN_LABEL_PX
    n_rows, n_cols = len(heads), max(1, len(panels))
    shares = []
    for _, attention in heads:
        grids = [token_grid(p.segment, attention) for p in panels]
        total = float(sum(g.sum() for g in grids)) or 1.0
        shares.append([g / total for g in grids])
    vmax = max([float(g.max()) for row in shares for g in row] or [1.0])
    width = PANEL_IN * n_cols + MARGIN_IN
    # A row as tall as its tallest panel at PANEL_IN wide (wide frames, tall pages), plus its title's room.
    aspect = max([p.segment.orig_size[1] / max(1, p.segment.orig_size[0]) for p in panels] or [1.0])
    row_in = min(3.2, max(1.0, PANEL_IN * aspect + 0.35))
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(width, row_in * n_rows + 0.9), dpi=DPI, squeeze=False, layout="compressed"
    )
    image = None
    for r, (name, _) in enumerate(heads):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            w, h = panel.segment.orig_size
            # Drawn in image coordinates (extent), from a bounded preview: never at full size.
            ax.imshow(preview(panel.picture, (w, h)), extent=(0, w, h, 0))
            xe, ye = panel.segment.cell_edges()
            image = ax.imshow(
                shares[r][c],
                extent=(xe[0], xe[-1], ye[-1], ye[0]),
                cmap="magma",
                alpha=0.6,
                vmin=0.0,
                vmax=vmax,
            )
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
                ax.text(-0.04, 0.5, name, transform=ax.transAxes, rotation=90, ha="right", va="center",
                        fontsize=LABEL_PT)  # fmt: skip
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.6)
        bar.set_label("share of the head's\nvisual attention", fontsize=LABEL_PT)
        bar.ax.tick_params(labelsize=LABEL_PT)
    if title:
        fig.suptitle(short_title(title, width), fontsize=TITLE_PT)
    return fig


def overlay_figure(
    panels: list[Panel], heads: list[tuple[str, np.ndarray]], path: str | Path, *, title: str = ""
) -> Path:
    """Write a heads x panels grid: each head's share of visual attention per token over each picture.

    At most `MAX_PANELS` panels, each `PANEL_IN` inches wide, labels at `LABEL_PT`: the figure is at most
    `REPORT_WIDTH_PX` wide in the report, so its labels are at least `MIN_LABEL_PX` tall there.
    """
    return save_figure(overlay_grid(panels, heads, title=title), path)


def attention_maps(
    m: Loaded,
    sample: Sample,
    heads: list[tuple[int, int]],
    query: str = "question",
    probe: KeyMapProbe | None = None,
) -> tuple[Prepared, dict[tuple[int, int], np.ndarray]]:
    """Return the prepared prompt and, per head, the mean attention of the `query` rows over every key.

    `probe`: a `KeyMapProbe(heads)` built without rows, shared by the samples drawn."""
    prepared = prepare(m, sample, answer=sample.answer if query == "answer" else None)
    probe = probe if probe is not None else KeyMapProbe(heads)
    context = AttentionContext.of(prepared, sample=sample, query_rows=prepared.rows(query))
    with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    return prepared, {head: values.double().numpy() for head, values in probe.maps.items()}


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


def write_overlays(
    m: Loaded,
    samples: list[Sample],
    heads: pd.DataFrame,
    folder: str | Path,
    *,
    k: int = 3,
    query: str = "question",
) -> list[Path]:
    """Draw the top-`k` and bottom-`k` heads' attention for each of `samples`; return the figure paths."""
    ranked = heads.sort_values("rank")
    top = list(zip(ranked["layer"].head(k).astype(int), ranked["head"].head(k).astype(int)))
    bottom = list(zip(ranked["layer"].tail(k).astype(int), ranked["head"].tail(k).astype(int)))
    paths = []
    probe = KeyMapProbe(top + bottom)  # one probe: each forward's context gives its rows
    for sample in samples:
        prepared, maps = attention_maps(m, sample, top + bottom, query, probe)
        rows = [(f"top {i + 1}: L{lh[0]}H{lh[1]}", maps[lh]) for i, lh in enumerate(top)]
        rows += [(f"bottom: L{lh[0]}H{lh[1]}", maps[lh]) for lh in bottom]
        path = inside(folder, Path(folder) / f"overlay-{safe_name(sample.id)}.png")
        paths.append(
            overlay_figure(panels(sample, prepared), rows, path, title=f"{sample.id}: {sample.question}")
        )
    return paths
