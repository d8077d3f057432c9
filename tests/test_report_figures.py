"""Figures that read at a glance: every drawn label lies inside the image, overlay labels stay >= 11 px once
the report scales the figure into its column, and coinciding depth profiles stay distinguishable. Synthetic
panels and tables: no model."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image

from corelens.layout import Segment
from corelens.report.figure import DPI, plt, save_figure
from corelens.report.overlay import MIN_LABEL_PX, REPORT_WIDTH_PX, Panel, overlay_grid
from corelens.report.run_comparison import depth_plot, spearman_figure

QUESTION = "doc-000017: What is written on the page that has the largest red square near its top left corner?"


def drawn_texts(fig, monkeypatch) -> tuple[list[tuple[Text, object]], object]:
    """Write `fig` as `save_figure` does; return every text artist the PNG shows (the last draw: a layout
    engine draws without rendering first), with its pixel box, and the image's box."""
    drawn, draw_text, draw_figure = [], Text.draw, Figure.draw

    def figure(self, renderer):
        drawn.clear()
        draw_figure(self, renderer)

    def text(self, renderer):
        draw_text(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append((self, self.get_window_extent(renderer), self.figure.bbox.frozen()))

    monkeypatch.setattr(Figure, "draw", figure)
    monkeypatch.setattr(Text, "draw", text)
    monkeypatch.setattr(plt, "close", lambda fig: None)  # keep the figure for the test to read
    save_figure(fig, Path(tempfile.mkdtemp()) / "figure.png")
    monkeypatch.undo()
    assert drawn
    return [(t, e) for t, e, _ in drawn], drawn[-1][2]


def clipped(texts, box) -> list[str]:
    return [
        t.get_text()
        for t, e in texts
        if e.x0 < box.x0 - 0.5 or e.y0 < box.y0 - 0.5 or e.x1 > box.x1 + 0.5 or e.y1 > box.y1 + 0.5
    ]


def _overlay(kind: str, n: int, size: tuple[int, int]):
    panels, start = [], 0
    for i in range(n):
        frames = (2 * i, 2 * i + 1) if kind == "video" else ()
        segment = Segment(kind, i if kind == "image" else 0, start, 4, 6, size, frames=frames)
        start += 24
        picture = Image.new("RGB", size, (40 * i, 120, 200))  # flat: a noisy picture only slows the PNG
        label = f"frames {2 * i}-{2 * i + 1}" if kind == "video" else f"image {i}"
        panels.append(Panel(segment, picture, label, [(10, 10, 50, 50)] if i == 0 else [], i == 0))
    attention = np.random.default_rng(0).random(start)
    attention /= attention.sum()  # one head's attention: sums to 1 over the keys
    heads = [(f"top {i + 1}: L{i}H{i + 10}", attention) for i in range(3)]
    heads += [(f"bottom: L2{i}H1{i}", attention) for i in range(3)]
    return overlay_grid(panels, heads, title=QUESTION)


@pytest.mark.parametrize(
    "kind, n, size", [("image", 1, (448, 448)), ("video", 6, (640, 360)), ("image", 6, (612, 792))]
)
def test_overlay_labels_are_inside_the_image_and_at_least_11_px_in_the_report(kind, n, size, monkeypatch):
    fig = _overlay(kind, n, size)
    try:
        texts, box = drawn_texts(fig, monkeypatch)
        assert clipped(texts, box) == []
        shown = min(1.0, REPORT_WIDTH_PX / (fig.get_figwidth() * DPI))  # the page scales wider figures down
        smallest = min(t.get_fontsize() * DPI / 72 for t, _ in texts) * shown
        assert smallest >= MIN_LABEL_PX, smallest
        assert any(t.get_text().startswith("top 1: L0H10") for t, _ in texts)  # the row labels are drawn
    finally:
        plt.close(fig)


def test_coinciding_depth_profiles_stay_distinguishable(monkeypatch):
    depth = pd.DataFrame(
        {"run": ["image"] * 4 + ["video"] * 4 + ["document"] * 4, "depth": [0.25, 0.5, 0.75, 1.0] * 3,
         "core_share": [0, 0.5, 0.25, 0.25] * 2 + [0.25, 0.25, 0.5, 0]}
    )  # fmt: skip
    fig = depth_plot(depth)
    try:
        texts, box = drawn_texts(fig, monkeypatch)
        assert clipped(texts, box) == []
        lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
        image, video = lines["image"], lines["video"]
        assert image.get_marker() != video.get_marker() and image.get_linestyle() != video.get_linestyle()
        assert not np.array_equal(image.get_xdata(), video.get_xdata())  # side by side, not on top
        texts = [t.get_text() for t, _ in texts]
        assert any("coincide: image = video" in t for t in texts)
        assert not any("document" in t and "=" in t for t in texts)
    finally:
        plt.close(fig)
    fig = depth_plot(depth[depth["run"] != "video"])
    try:
        assert not any("coincide" in t.get_text() for t, _ in drawn_texts(fig, monkeypatch)[0])
    finally:
        plt.close(fig)


def test_spearman_matrix_labels_are_inside_the_image(monkeypatch):
    labels = ["image", "video", "document-long-task-name"]
    pairs = pd.DataFrame(
        {"a": ["image", "image", "video"], "b": ["video", labels[2], labels[2]],
         "spearman": [0.9, 0.2, 0.1], "low": [0.8, -0.1, -0.3], "high": [0.95, 0.5, 0.4]}
    )  # fmt: skip
    saved = []
    monkeypatch.setattr("corelens.report.run_comparison.save_figure", lambda fig, path: saved.append(fig))
    spearman_figure(pairs, labels, "unused.png")
    monkeypatch.undo()
    try:
        assert clipped(*drawn_texts(saved[0], monkeypatch)) == []
    finally:
        plt.close(saved[0])


def _page_overlay(parts: dict[str, float]):
    """A one-page overlay of heads with `parts` of their attention on the page (peaked on cell (1, 2)), over a
    picture of flat coloured blocks, one block per cell; return the figure and the picture's block colours."""
    segment = Segment("image", 0, 10, 4, 6, (480, 320))
    colours = np.random.default_rng(1).integers(40, 220, (4, 6, 3))
    picture = Image.fromarray(np.kron(colours, np.ones((80, 80, 1))).astype(np.uint8))
    peak = np.full((4, 6), 0.02)
    peak[1, 2] = 1 - 0.02 * 23
    heads = []
    for name, part in parts.items():
        attention = np.zeros(10 + 24 + 5)
        attention[10:34] = part * peak.ravel()
        attention[:10] = 1 - part  # the rest on the text
        heads.append((name, attention))
    return overlay_grid([Panel(segment, picture, "page 0", [], True)], heads), colours


def _panel_pixels(fig, ax) -> np.ndarray:
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    box = ax.get_window_extent()
    height = rgb.shape[0]
    return rgb[round(height - box.y1) + 2 : round(height - box.y0) - 2, round(box.x0) + 2 : round(box.x1) - 2]


def test_overlay_outlines_a_strong_head_and_leaves_a_null_head_bare():
    """Issue 44: on a page, a head with 28 % of its attention there and one with 0.2 % must look different
    (one scale for all heads), and the outline leaves the picture's colour inside every cell."""
    fig, colours = _page_overlay({"top 1: L0H6": 0.28, "bottom: L3H4": 0.002})
    try:
        strong, null = (_panel_pixels(fig, row[0]) for row in np.atleast_2d(fig.axes[:2]).reshape(2, 1))
        yellow = lambda px: ((px[..., 0] > 200) & (px[..., 1] > 170) & (px[..., 2] < 80)).sum()  # noqa: E731
        assert yellow(strong) > 200 and yellow(null) == 0, (yellow(strong), yellow(null))
        texts = [t.get_text() for t in fig.texts + [t for ax in fig.axes for t in ax.texts]]
        assert any("28 % on these pictures" in t for t in texts) and any("0 % on these" in t for t in texts)
        rows, cols = min(strong.shape[0], null.shape[0]), min(strong.shape[1], null.shape[1])
        assert (
            np.abs(strong[:rows, :cols] - null[:rows, :cols]).mean() > 2
        )  # the drawn images differ measurably
        h, w = null.shape[0] / 4, null.shape[1] / 6
        for r in range(4):  # the middle of every cell keeps the picture's colour, outlined or not
            for c in range(6):
                middle = strong[
                    round((r + 0.4) * h) : round((r + 0.6) * h), round((c + 0.4) * w) : round((c + 0.6) * w)
                ]
                assert np.abs(middle - colours[r, c]).max() <= 3, (r, c)
        peak_box = strong[round(1 * h) : round(2 * h), round(2 * w) : round(3 * w)]
        assert yellow(peak_box) > 0.5 * yellow(strong)  # the heaviest outline: the cell of the most attention
    finally:
        plt.close(fig)


def test_heads_heatmap_puts_layer_0_at_the_top_as_the_explorer_grid():
    from corelens.report.heatmap import heatmap_figure

    heads = pd.DataFrame(
        {"layer": [0, 0, 1, 1, 2, 2], "head": [0, 1] * 3, "mass": [0.9, 0.1, 0.2, 0.3, 0.1, 0.1]}
    )
    fig = heatmap_figure(heads)
    try:
        ax = fig.axes[0]
        fig.canvas.draw()
        assert ax.yaxis_inverted()
        labels = sorted(
            ax.get_yticklabels(), key=lambda t: -t.get_window_extent().y0
        )  # top of the image first
        assert [t.get_text() for t in labels] == ["L0", "L1", "L2"]
        assert ax.images[0].get_array()[0, 0] == pytest.approx(0.9)  # row 0 of the image: layer 0
    finally:
        plt.close(fig)
