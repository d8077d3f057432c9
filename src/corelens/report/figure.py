"""Shared figure plumbing: matplotlib on the Agg backend and one way to save a figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

from corelens.runs.files import writer

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["DPI", "plt", "save_figure"]

DPI = 120  # every figure is written at this resolution


def label_accuracy(ax, xlabel: str, ylabel: str = "accuracy") -> None:
    """Label an accuracy plot: `xlabel`, the accuracy axis over [0, 1] (a margin keeps points at 0 and 1
    whole) and the legend where it hides least."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8, loc="best")


def save_figure(fig, path: str | Path) -> Path:
    """Lay out `fig`, write it to `path` (PNG, `DPI` dpi; folders created), close it; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()

    with writer(path) as f:  # never through a link planted at `path`
        fig.savefig(f, dpi=DPI, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
