"""Attention overlays: a head's attention over visual tokens drawn on the images, frames or pages it covers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.patches import Rectangle
from PIL import Image

from corelens.layout import Segment
from corelens.report.figure import plt, save_figure

# Longest side, in pixels, of the picture drawn under an overlay: a panel is about 2 inches wide at the
# figure's dpi, so more pixels add memory and nothing visible (a 12000 x 12000 image would take 430 MB).
OVERLAY_MAX_SIDE = 1024


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


def overlay_figure(
    panels: list[Panel], heads: list[tuple[str, np.ndarray]], path: str | Path, *, title: str = ""
) -> Path:
    """Write a heads x panels grid: each head's share of visual attention per token over each picture."""
    n_rows, n_cols = len(heads), max(1, len(panels))
    shares = []
    for _, attention in heads:
        grids = [token_grid(p.segment, attention) for p in panels]
        total = float(sum(g.sum() for g in grids)) or 1.0
        shares.append([g / total for g in grids])
    vmax = max([float(g.max()) for row in shares for g in row] or [1.0])
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(2.2 * n_cols + 1.2, 2.1 * n_rows + 0.6), squeeze=False, layout="constrained"
    )
    image = None
    for r, (name, _) in enumerate(heads):
        for c, panel in enumerate(panels):
            ax = axes[r][c]
            width, height = panel.segment.orig_size
            # Drawn in image coordinates (extent), from a bounded preview: never at full size.
            ax.imshow(preview(panel.picture, (width, height)), extent=(0, width, height, 0))
            xe, ye = panel.segment.cell_edges()
            image = ax.imshow(
                shares[r][c],
                extent=(xe[0], xe[-1], ye[-1], ye[0]),
                cmap="magma",
                alpha=0.6,
                vmin=0.0,
                vmax=vmax,
            )
            ax.set_xlim(min(0, xe[0]), max(width, xe[-1]))
            ax.set_ylim(max(height, ye[-1]), min(0, ye[0]))
            for x0, y0, x1, y1 in panel.boxes:
                ax.add_patch(
                    Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="cyan", linewidth=1.5)
                )
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(panel.label + (" (target)" if panel.hit else ""), fontsize=8)
            if c == 0:
                ax.set_ylabel(name, fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="share of the head's visual attention")
    if title:
        fig.suptitle(title if len(title) < 90 else title[:87] + "...", fontsize=9)
    return save_figure(fig, path)
