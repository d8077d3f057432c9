"""SAP priors (docs/methods.md#sap): distributions over a prompt's visual tokens V (in position order), one
registered class each; `build_prior(m, sample, prepared, kind)` is one per (prompt, kind, seed, temperature).

- `vis_attn`: the vision encoder's last-block self-attention, averaged over its queries (per attention
  chunk: image, frame group or window) and heads, pooled over each 2 x 2 merge group (Qwen2.5-VL's window
  order undone);
- `complexity`: per visual-token cell of the processed (resized) image, grey-level mean |horizontal
  difference| + mean |vertical difference| + variance, min-max normalised to [0, 1], then softmax(x / T);
- `noise`: a Dirichlet(1, ..., 1) draw (seeded per sample);
- `key`: softmax(x / T) of each cell's IoU x with the target boxes (max over targets; video: over the
  group's frames);
- `own` (control): the row's own visual distribution (None; a no-op under the mass convention).

A new prior is a `Prior` subclass with a `name` and `values(...)`, registered with `@register_prior`.
"""

from __future__ import annotations

import abc
import weakref
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from PIL import Image

from corelens.data.sample import Sample, load_images, load_video
from corelens.errors import CorelensError, InputError, UnsupportedModelError
from corelens.layout import Layout, Segment
from corelens.policies.core import PolicyInterface

if TYPE_CHECKING:
    from corelens.models.loaded import Loaded
    from corelens.models.prepare import Prepared

TEMPERED = ("key", "complexity")  # priors that are a softmax of values in [0, 1]: the temperature applies
_VIS_CHUNK = 1 << 24  # score elements materialised at once in the vision-attention prior


def sample_seed(seed: int, sample_id: str) -> int:
    """Return a per-sample seed that does not depend on the order of the sample file (as `experiments.flow`)."""
    return (seed * 1_000_003 + zlib.crc32(sample_id.encode())) % (1 << 62)


def _softmax(v: np.ndarray) -> np.ndarray:
    e = np.exp(v - v.max())
    return e / e.sum()


def _index(layout: Layout) -> dict[int, int]:
    return {int(p): i for i, p in enumerate(layout.visual)}


def _place(layout: Layout, per_segment: list[tuple[Segment, np.ndarray]]) -> np.ndarray:
    """Return one value per visual token (layout.visual order) from (segment, rows x cols values)."""
    out = np.zeros(len(layout.visual))
    where = _index(layout)
    for seg, grid in per_segment:
        r, c = np.meshgrid(np.arange(seg.rows), np.arange(seg.cols), indexing="ij")
        for pos, value in zip(np.asarray(seg.token(r, c)).ravel(), grid.ravel()):
            out[where[int(pos)]] = value
    return out


def prior_noise(layout: Layout, seed: int) -> np.ndarray:
    """Return a Dirichlet(1, ..., 1) distribution over the visual tokens."""
    return np.random.default_rng(seed).dirichlet(np.ones(len(layout.visual)))


def _iou(cells: tuple[np.ndarray, np.ndarray], box) -> np.ndarray:
    """Return each cell's IoU with `box`; `cells` = (column spans, row spans) from `Segment.cell_spans()`."""
    xs, ys = cells
    x0, y0, x1, y1 = (float(v) for v in box)
    ox = np.clip(np.minimum(xs[:, 1], x1) - np.maximum(xs[:, 0], x0), 0.0, None)
    oy = np.clip(np.minimum(ys[:, 1], y1) - np.maximum(ys[:, 0], y0), 0.0, None)
    inter = oy[:, None] * ox[None, :]
    cell = (ys[:, 1] - ys[:, 0])[:, None] * (xs[:, 1] - xs[:, 0])[None, :]
    return inter / (cell + (x1 - x0) * (y1 - y0) - inter)


def prior_key(layout: Layout, sample: Sample, temperature: float = 1.0) -> np.ndarray:
    """Return softmax(IoU / T) over visual tokens of each cell's IoU with the sample's target boxes."""
    parts = []
    for seg in layout.segments:
        iou = np.zeros((seg.rows, seg.cols))
        w, h = seg.orig_size
        for t in sample.targets:
            boxes = []
            if seg.kind == "image" and t.kind == "box" and t.image == seg.source:
                boxes = [t.box]
            elif seg.kind == "image" and t.kind == "image" and t.image == seg.source:
                boxes = [(0.0, 0.0, w, h)]
            elif seg.kind == "video" and t.kind == "tube":
                by_frame = dict(zip(t.frames, t.boxes))
                boxes = [by_frame[f] for f in seg.frames if f in by_frame]
            for box in boxes:
                iou = np.maximum(iou, _iou(seg.cell_spans(), box))
        parts.append((seg, iou))
    return _softmax(_place(layout, parts) / temperature)


def _cell_complexity(image: Image.Image, rows: int, cols: int, cell: int) -> np.ndarray:
    grey = np.asarray(image.convert("L").resize((cols * cell, rows * cell), Image.BICUBIC), dtype=np.float64)
    blocks = (grey / 255.0).reshape(rows, cell, cols, cell).transpose(0, 2, 1, 3)  # rows, cols, y, x
    dx = np.abs(np.diff(blocks, axis=3)).mean(axis=(2, 3))
    dy = np.abs(np.diff(blocks, axis=2)).mean(axis=(2, 3))
    return dx + dy + blocks.var(axis=(2, 3))


def _segment_complexity(image: Image.Image, seg, cell: int) -> np.ndarray:
    """Return the rows x cols complexity of the cells of one layout segment, each resampled to cell x cell."""
    if seg.col_spans is None and seg.row_spans is None:
        # Evenly split cells (a whole image, or a tile / crop `region` of it): one resize of the covered area.
        if seg.region is not None:
            image = image.crop(tuple(int(round(v)) for v in seg.region))
        return _cell_complexity(image, seg.rows, seg.cols, cell)
    # Cells with their own spans (bilinear footprints, which may overlap): each cell's span on its own.
    xs, ys = seg.cell_spans()
    out = np.empty((seg.rows, seg.cols))
    for r, (y0, y1) in enumerate(ys):
        for c, (x0, x1) in enumerate(xs):
            box = (int(np.floor(x0)), int(np.floor(y0)), max(int(np.ceil(x1)), int(np.floor(x0)) + 1),
                   max(int(np.ceil(y1)), int(np.floor(y0)) + 1))  # fmt: skip
            out[r, c] = _cell_complexity(image.crop(box), 1, 1, cell)[0, 0]
    return out


def prior_complexity(m: Loaded, layout: Layout, sample: Sample, temperature: float = 1.0) -> np.ndarray:
    """Return softmax(x / T) of the min-max normalised per-cell complexity x of the processed images / frames.

    A cell is resampled to the processor's cell size (patch x merge, for Qwen-VL 28 pixels) where the processor
    has one, else to 14 pixels (the patch of the LLaVA and InternVL vision towers); each layout segment's cells
    are read from their own spans, so tiles, crops and thumbnails count their part of the image.
    """
    ip = m.processor.image_processor
    cell = int(getattr(ip, "patch_size", None) or 14) * int(getattr(ip, "merge_size", None) or 1)
    images = load_images(sample) if sample.images else []
    frames = load_video(sample)[0] if sample.video is not None else []
    parts = []
    for seg in layout.segments:
        if seg.kind == "image":
            grid = _segment_complexity(images[seg.source], seg, cell)
        else:
            grid = np.mean([_segment_complexity(frames[f], seg, cell) for f in seg.frames], axis=0)
        parts.append((seg, grid))
    values = _place(layout, parts)
    span = values.max() - values.min()
    return _softmax((values - values.min()) / span / temperature if span > 0 else np.zeros_like(values))


def _vision_tower(m: Loaded) -> torch.nn.Module:
    if m.family.vision_rotary is None:
        raise UnsupportedModelError(
            f"the vis_attn prior recomputes the vision tower's attention, which corelens does not know for "
            f"{m.model_type} (its family has no vision_rotary)"
        )
    for name, module in m.model.named_modules():
        if name.endswith("visual") and hasattr(module, "blocks"):
            return module
    raise UnsupportedModelError(f"no vision tower with `blocks` found in {type(m.model).__name__}")


def _column_mass(
    attn: torch.nn.Module, hidden: torch.Tensor, cu_seqlens, position_embeddings, rotary
) -> torch.Tensor:
    """Return, per vision token, its attention received averaged over queries (per chunk) and heads.

    `rotary` is the tower's rotary embedding (the family's `vision_rotary`), as its attention applies it.
    """
    n = hidden.shape[0]
    q, k, _ = attn.qkv(hidden).reshape(n, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    q, k = rotary(q, k, cos, sin)
    q, k = q.float().transpose(0, 1), k.float().transpose(0, 1)  # heads, tokens, dim
    out = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    bounds = cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        kc = k[:, a:b]
        step = max(1, _VIS_CHUNK // max(1, attn.num_heads * (b - a)))
        for r in range(a, b, step):
            p = torch.softmax(q[:, r : min(b, r + step)] @ kc.transpose(1, 2) * attn.scaling, dim=-1)
            out[a:b] += p.sum(dim=(0, 1))
        out[a:b] /= (b - a) * attn.num_heads
    return out


def _recorder(into: list):
    def hook(module, args, kwargs):
        into.append((args, kwargs))

    return hook


def prior_vis_attn(m: Loaded, prepared: Prepared) -> np.ndarray:
    """Return the vision encoder's last-block attention received per decoder visual token, normalised."""
    visual = _vision_tower(m)
    attn = visual.blocks[-1].attn
    merge = int(getattr(visual, "spatial_merge_size", 2)) ** 2
    pooled = []
    for pixels, grid in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        if prepared.inputs.get(pixels) is None:
            continue
        seen: list = []
        handle = attn.register_forward_pre_hook(_recorder(seen), with_kwargs=True)
        try:
            with torch.no_grad():
                thw = prepared.inputs[grid].to(m.device)
                dtype = next(visual.parameters()).dtype
                visual(prepared.inputs[pixels].to(m.device, dtype), grid_thw=thw)
                args, kwargs = seen[-1]
                hidden = args[0] if args else kwargs["hidden_states"]
                mass = _column_mass(
                    attn, hidden, kwargs["cu_seqlens"], kwargs["position_embeddings"], m.family.rotary()
                )
        finally:
            handle.remove()
        merged = mass.view(-1, merge).sum(1)
        if hasattr(visual, "window_size"):  # Qwen2.5-VL runs its blocks in window order: undo it
            from transformers.vision_utils import get_vision_window_index

            index, _ = get_vision_window_index(
                thw.cpu(),
                spatial_merge_size=visual.spatial_merge_size,
                window_size=visual.window_size,
                patch_size=visual.patch_size,
            )
            merged = merged[torch.argsort(index.to(merged.device))]
        pooled.append(merged.double().cpu().numpy())
    values = np.concatenate(pooled)
    if len(values) != len(prepared.layout.visual):
        raise UnsupportedModelError(
            f"vision tower gave {len(values)} tokens for {len(prepared.layout.visual)} visual tokens"
        )
    return values / values.sum()


@dataclass(frozen=True)
class Prior(abc.ABC):
    """A distribution over the visual tokens of one prompt; `values` returns it (None: the row's own)."""

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def values(
        self, m: Loaded, sample: Sample, prepared: Prepared, seed: int, temperature: float
    ) -> np.ndarray | None:
        """Return the prior over `prepared.layout.visual` (in that order)."""


class PriorInterface(PolicyInterface):
    """name -> Prior class: the registry of `PolicyInterface` (keyed by `name`), with a mapping of its own."""

    _global_mapping: dict[str, type[Prior]] = {}
    kind = "prior"


PRIOR_CLASSES = PriorInterface()
register_prior = PriorInterface.register


@register_prior
class OwnPrior(Prior):
    """The control: the row's own visual distribution (an exact no-op under the mass convention)."""

    name = "own"

    def values(self, m, sample, prepared, seed, temperature):
        return None


@register_prior
class NoisePrior(Prior):
    """A Dirichlet(1, ..., 1) draw, seeded by (seed, sample id)."""

    name = "noise"

    def values(self, m, sample, prepared, seed, temperature):
        return prior_noise(prepared.layout, sample_seed(seed, sample.id))


@register_prior
class KeyPrior(Prior):
    """softmax(IoU / T) of each cell with the sample's target boxes."""

    name = "key"

    def values(self, m, sample, prepared, seed, temperature):
        if not sample.targets:
            raise InputError(
                "the key prior needs targets", file=sample.source, line=sample.line, sample=sample.id
            )
        return prior_key(prepared.layout, sample, temperature)


@register_prior
class ComplexityPrior(Prior):
    """softmax(x / T) of each cell's normalised grey-level complexity."""

    name = "complexity"

    def values(self, m, sample, prepared, seed, temperature):
        return prior_complexity(m, prepared.layout, sample, temperature)


@register_prior
class VisAttnPrior(Prior):
    """The vision encoder's last-block attention received per visual token."""

    name = "vis_attn"

    def values(self, m, sample, prepared, seed, temperature):
        return prior_vis_attn(m, prepared)


_memo: dict[int, dict] = {}  # id(prepared) -> {(kind, seed, temperature): prior}, dropped with the prompt


def build_prior(
    m: Loaded, sample: Sample, prepared: Prepared, kind: str, *, seed: int = 0, temperature: float = 1.0
) -> np.ndarray | None:
    """Return prior `kind` over the visual tokens of `prepared` (None for the 'own' control).

    `temperature` divides the inputs of the `key` and `complexity` softmaxes (the others ignore it). A prompt
    computes each (kind, seed, temperature) once, however many policies read it.
    """
    if not temperature > 0:
        raise CorelensError(f"--prior-temperature must be positive, got {temperature}")
    prior = PRIOR_CLASSES[kind]()
    if prepared is None:
        return prior.values(m, sample, prepared, seed, temperature)
    key = id(prepared)
    if key not in _memo:
        _memo[key] = {}
        weakref.finalize(prepared, _memo.pop, key, None)
    memo = _memo[key]
    if (kind, seed, temperature) not in memo:
        memo[(kind, seed, temperature)] = prior.values(m, sample, prepared, seed, temperature)
    return memo[(kind, seed, temperature)]
