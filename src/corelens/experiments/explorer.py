"""The head explorer's data: per-sample, per-head visual attention maps, quantised to uint8 (`explorer.npz`).

Every stored sample keeps its `top` best heads; the first `all_samples` keep every head. A map is the head's
share of its attention over the cells of the sample's first panel (the one holding the target), average-
pooled to at most `MAX_CELLS` cells and scaled to 0..255 (its maximum share is kept as a float32). So a run
stores at most (heads x all_samples + top x (samples - all_samples)) x MAX_CELLS bytes of maps, plus one
JPEG of at most `PICTURE` pixels a side per sample: for 28 x 28 heads, 200 samples, top 32 and 8 full
samples, (784 x 8 + 32 x 192) x 1024 B = 12.7 MB (17 MB once base64-encoded in the page).
"""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from corelens.data.sample import Sample
from corelens.experiments.overlay import attention_maps, panels
from corelens.models.loaded import Loaded
from corelens.report.overlay import token_grid
from corelens.runs.files import write_text, writer
from corelens.runs.outputs import RANK

MAX_CELLS = 1024
PICTURE = 192
TOP = 32
ALL_SAMPLES = 8


def bound_bytes(n_heads: int, samples: int, *, top: int = TOP, all_samples: int = ALL_SAMPLES) -> int:
    """Return the most bytes of maps a run stores for `n_heads` heads and `samples` samples."""
    full = min(all_samples, samples)
    return (n_heads * full + min(top, n_heads) * (samples - full)) * MAX_CELLS


def pool(grid: np.ndarray, max_cells: int = MAX_CELLS) -> np.ndarray:
    """Return `grid` summed over square blocks so that it has at most `max_cells` cells (shares stay shares)."""
    f = max(1, math.ceil(math.sqrt(grid.size / max_cells)))
    while (
        math.ceil(grid.shape[0] / f) * math.ceil(grid.shape[1] / f) > max_cells
    ):  # rounding up can overshoot
        f += 1
    rows, cols = -(-grid.shape[0] // f) * f, -(-grid.shape[1] // f) * f
    padded = np.zeros((rows, cols))
    padded[: grid.shape[0], : grid.shape[1]] = grid
    return padded.reshape(rows // f, f, cols // f, f).sum(axis=(1, 3))


def _picture(panel) -> str:
    picture = panel.picture.convert("RGB").resize(panel.segment.orig_size)
    picture.thumbnail((PICTURE, PICTURE))
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=80)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def write_explorer(
    m: Loaded,
    samples: list[Sample],
    heads: pd.DataFrame,
    folder: str | Path,
    *,
    query: str = "question",
    top: int = TOP,
    all_samples: int = ALL_SAMPLES,
) -> tuple[Path, int]:
    """Write `explorer.npz` and `explorer.json` for `samples` into `folder`; return the npz path and its size."""
    ranked = heads.sort_values("rank")
    every = list(zip(ranked["layer"].astype(int), ranked["head"].astype(int)))
    arrays, meta = {}, []
    for i, sample in enumerate(samples):
        chosen = every if i < all_samples else every[:top]
        prepared, maps = attention_maps(m, sample, chosen, query)
        panel = panels(sample, prepared, max_panels=1)[0]
        grids = []
        for head in chosen:
            grid = token_grid(panel.segment, maps[head])
            grids.append(pool(grid / (grid.sum() or 1.0)))
        stack = np.stack(grids)
        scale = stack.max(axis=(1, 2))
        arrays[f"maps_{i}"] = np.round(255 * stack / np.where(scale > 0, scale, 1)[:, None, None]).astype(
            np.uint8
        )
        arrays[f"scale_{i}"] = scale.astype(np.float32)
        arrays[f"heads_{i}"] = np.asarray(chosen, dtype=np.int16)
        xe, ye = panel.segment.cell_edges()
        meta.append(
            {
                "id": sample.id,
                "question": sample.question,
                "label": panel.label,
                "size": list(panel.segment.orig_size),
                "extent": [float(xe[0]), float(ye[0]), float(xe[-1]), float(ye[-1])],
                "boxes": [list(map(float, b)) for b in panel.boxes],
                "picture": _picture(panel),
            }
        )
    folder = Path(folder)
    with writer(folder / "explorer.npz", root=folder) as f:
        np.savez_compressed(f, **arrays)
    write_text(RANK.path(folder, "explorer"), json.dumps({"samples": meta, "top": top, "all_samples": all_samples}),
               root=folder)  # fmt: skip
    return folder / "explorer.npz", (folder / "explorer.npz").stat().st_size
