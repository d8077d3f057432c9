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
