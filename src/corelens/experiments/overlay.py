"""Where top and bottom heads look: per-key attention of chosen heads for one sample, drawn on its pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from corelens.attention import activate
from corelens.attention.probes import KeyMapProbe
from corelens.data.paths import inside, safe_name
from corelens.data.sample import Sample, load_images, load_video
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare
from corelens.report.overlay import MAX_PANELS, Panel, overlay_figure, preview


def attention_maps(
    m: Loaded, sample: Sample, heads: list[tuple[int, int]], query: str = "question"
) -> tuple[Prepared, dict[tuple[int, int], np.ndarray]]:
    """Return the prepared prompt and, per head, the mean attention of the `query` rows over every key."""
    prepared = prepare(m, sample, answer=sample.answer if query == "answer" else None)
    probe = KeyMapProbe(heads, torch.from_numpy(prepared.rows(query)), prepared.seq_len)
    with torch.no_grad(), activate(m.layer_modules(), probe):
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
        # A bounded preview (report.overlay.OVERLAY_MAX_SIDE): the full-size pixels are not kept for drawing.
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
    for sample in samples:
        prepared, maps = attention_maps(m, sample, top + bottom, query)
        rows = [(f"top {i + 1}: L{lh[0]}H{lh[1]}", maps[lh]) for i, lh in enumerate(top)]
        rows += [(f"bottom: L{lh[0]}H{lh[1]}", maps[lh]) for lh in bottom]
        path = inside(folder, Path(folder) / f"overlay-{safe_name(sample.id)}.png")
        paths.append(
            overlay_figure(panels(sample, prepared), rows, path, title=f"{sample.id}: {sample.question}")
        )
    return paths
