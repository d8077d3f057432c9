"""SAP sweep and key-region ratio (docs/methods.md#sap): accuracy with priors in place of learned visual attention.

Per sample: the unmodified model's greedy answer (the evaluation harness), its key-region ratio at the
answer position (Σ_Ω A / Σ_V A, per layer and head from a RAM probe, averaged) against the area prior
|Ω| / |V|, and one greedy answer per (prior, layer set) with `SapHook` active. Priors, each a distribution
over the prompt's visual tokens V (in position order):

- `vis_attn`: the vision encoder's last-block self-attention, averaged over its queries (per attention
  chunk: image, frame group or window) and heads, pooled over each 2 x 2 merge group (Qwen2.5-VL's window
  order undone);
- `complexity`: per visual-token cell of the processed (resized) image, grey-level mean |horizontal
  difference| + mean |vertical difference| + variance, min-max normalised to [0, 1], then softmax(x / T);
- `noise`: a Dirichlet(1, ..., 1) draw (seeded per sample);
- `key`: softmax(x / T) of each cell's IoU x with the target boxes (max over targets; video: over the
  group's frames);
- `own` (control): the row's own visual distribution (a no-op under the mass convention).

The temperature T (`prior_temperature`, default 1) sets the strength of `key` and `complexity`: their inputs
lie in [0, 1], so at T = 1 the largest and smallest weights differ by at most e and the prior is close to
uniform; T = 0.1 allows e^10. Writes sap.parquet, accuracy.csv, key_region.csv, priors.csv (each prior's
mass on Ω against the area share |Ω| / |V| and the model's own share Σ_Ω A / Σ_V A) and a figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

from corelens.attention import RamProbe, activate
from corelens.attention.priors import CONVENTIONS, SapHook, parse_heads, parse_layers
from corelens.choices import PRIORS
from corelens.choices import SAP_CONTROLS as CONTROLS
from corelens.data.sample import Sample, load_images, load_video
from corelens.errors import CorelensError, InputError, OptionError, UnsupportedModelError
from corelens.experiments.evaluate import answer, interval, score
from corelens.experiments.flow import sample_seed
from corelens.experiments.loading import run_loaded
from corelens.layout import Layout, Segment
from corelens.models.loaded import Loaded, load
from corelens.models.prepare import Prepared, prepare, prompt_length
from corelens.runs import model_data_settings
from corelens.runs.context import RunContext
from corelens.runs.driver import Loop
from corelens.runs.outputs import SAP, conclude

TEMPERED = ("key", "complexity")  # priors that are a softmax of values in [0, 1]: the temperature applies
_VIS_CHUNK = 1 << 24  # score elements materialised at once in the vision-attention prior


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


def build_prior(
    m: Loaded, sample: Sample, prepared: Prepared, kind: str, *, seed: int = 0, temperature: float = 1.0
) -> np.ndarray | None:
    """Return prior `kind` over the visual tokens of `prepared` (None for the 'own' control).

    `temperature` divides the inputs of the `key` and `complexity` softmaxes (the others ignore it).
    """
    if not temperature > 0:
        raise CorelensError(f"--prior-temperature must be positive, got {temperature}")
    if kind == "own":
        return None
    if kind == "noise":
        return prior_noise(prepared.layout, sample_seed(seed, sample.id))
    if kind == "key":
        if not sample.targets:
            raise InputError(
                "the key prior needs targets", file=sample.source, line=sample.line, sample=sample.id
            )
        return prior_key(prepared.layout, sample, temperature)
    if kind == "complexity":
        return prior_complexity(m, prepared.layout, sample, temperature)
    if kind == "vis_attn":
        return prior_vis_attn(m, prepared)
    raise OptionError(f"unknown prior {kind!r}; expected one of {PRIORS + CONTROLS}")


def key_region(m: Loaded, sample: Sample, prepared: Prepared | None = None) -> tuple[float, float]:
    """Return (key-region ratio Σ_Ω A / Σ_V A at the answer position, averaged over layers and heads, |Ω|/|V|)."""
    prepared = prepared or prepare(m, sample)
    omega = prepared.layout.omega(sample.targets, sample=sample.id)
    visual = prepared.layout.visual
    if not len(omega):
        raise InputError(
            "the targets cover no visual token", file=sample.source, line=sample.line, sample=sample.id
        )
    probe = RamProbe(
        m.num_layers,
        m.num_heads,
        torch.from_numpy(prepared.rows("last")),
        torch.from_numpy(omega),
        torch.from_numpy(visual),
        prepared.seq_len,
    )
    with torch.no_grad(), activate(m.layer_modules(), probe):
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    mass, vis = probe.mass.double().numpy(), probe.visual_mass.double().numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(vis > 0, mass / vis, np.nan)
    return float(np.nanmean(ratio)), len(omega) / len(visual)


@dataclass(frozen=True)
class Condition:
    """One SAP setting: a prior on a layer set and head set, under a convention."""

    prior: str
    layers: str
    heads: str = "all"
    convention: str = "mass"

    @property
    def name(self) -> str:
        """Return a label like "noise@21-27" (heads / convention appended when not the defaults)."""
        extra = ("" if self.heads == "all" else f"/h{self.heads}") + (
            "" if self.convention == "mass" else f"/{self.convention}"
        )
        return f"{self.prior}@{self.layers}{extra}"


def answer_with(
    m: Loaded, sample: Sample, prepared: Prepared, prior, cond: Condition, max_new_tokens: int
) -> str:
    """Return the greedy answer with `prior` applied on the condition's layers and heads."""
    layers = parse_layers(cond.layers, m.num_layers)
    hook = SapHook(
        torch.from_numpy(prepared.layout.visual),
        None if prior is None else torch.from_numpy(np.asarray(prior, dtype=np.float32)),
        prepared.prompt_len,
        heads=parse_heads(cond.heads, m.num_heads),
        convention=cond.convention,
    )
    with activate([(i, m.attention_layers[i]) for i in layers], hook):
        return answer(m, sample, max_new_tokens=max_new_tokens, prepared=prepared)


def measure_sample(
    m: Loaded,
    sample: Sample,
    conditions: Sequence[Condition],
    *,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    seed: int = 0,
    temperature: float = 1.0,
    prepared: Prepared | None = None,
) -> dict:
    """Return one sample's record: vanilla answer, key-region ratio, area prior, answers per condition.

    `prior_omega` holds each prior's mass on Ω and `prior_spread` its largest / smallest weight; `prepared`
    is the sample as the driver prepared it (prepared here when not given).
    """
    if sample.answer is None:
        raise InputError(
            "SAP needs an answer to score", file=sample.source, line=sample.line, sample=sample.id
        )
    prepared = prepared if prepared is not None else prepare(m, sample)
    vanilla = answer(m, sample, max_new_tokens=max_new_tokens, prepared=prepared)
    ratio, area = key_region(m, sample, prepared) if sample.targets else (float("nan"), float("nan"))
    priors: dict[str, np.ndarray | None] = {}
    answers = {}
    for cond in conditions:
        if cond.prior not in priors:
            priors[cond.prior] = build_prior(
                m, sample, prepared, cond.prior, seed=seed, temperature=temperature
            )
        pred = answer_with(m, sample, prepared, priors[cond.prior], cond, max_new_tokens)
        answers[cond.name] = {
            "prediction": pred,
            "correct": score(pred, sample.answer, sample.choices, scorer),
        }
    in_omega = (
        np.isin(prepared.layout.visual, prepared.layout.omega(sample.targets, sample=sample.id))
        if sample.targets
        else None
    )
    shown = {k: v for k, v in priors.items() if v is not None}
    return {
        "id": sample.id,
        "task": sample.task,
        "status": "ok",
        "gold": sample.answer,
        "prior_omega": {
            k: float(v[in_omega].sum()) if in_omega is not None else float("nan") for k, v in shown.items()
        },
        "prior_spread": {k: float(v.max() / v.min()) for k, v in shown.items()},
        "vanilla": {"prediction": vanilla, "correct": score(vanilla, sample.answer, sample.choices, scorer)},
        "key_ratio": ratio,
        "area": area,
        "conditions": answers,
    }


@dataclass
class SapResult:
    """SAP tables: per sample and condition, accuracy per condition, key-region ratio by correctness, priors."""

    frame: pd.DataFrame
    accuracy: pd.DataFrame
    key_region: pd.DataFrame
    priors: pd.DataFrame


PRIOR_COLUMNS = ["prior", "temperature", "n", "omega_mass", "area_share", "model_share", "lift", "spread"]


def prior_table(records: Sequence[dict], temperature: float) -> pd.DataFrame:
    """Return, per prior, its mean mass on Ω beside the area share |Ω| / |V| and the model's own Ω share.

    `model_share` is the key-region ratio Σ_Ω A / Σ_V A of the unmodified model (answer position, mean over
    layers and heads); `lift` = omega_mass / area_share, 1 for a uniform prior; `spread` is the median over
    samples of the prior's largest / smallest weight. Samples without targets are left out.
    """
    rows = []
    kinds = list(dict.fromkeys(k for r in records for k in r.get("prior_omega", {})))
    for kind in kinds:
        got = [r for r in records if kind in r["prior_omega"] and not np.isnan(r["prior_omega"][kind])]
        mass = np.array([r["prior_omega"][kind] for r in got])
        area = np.array([r["area"] for r in got])
        rows.append(
            {
                "prior": kind,
                "temperature": temperature if kind in TEMPERED else float("nan"),
                "n": len(got),
                "omega_mass": float(mass.mean()) if len(got) else float("nan"),
                "area_share": float(area.mean()) if len(got) else float("nan"),
                "model_share": float(np.mean([r["key_ratio"] for r in got])) if len(got) else float("nan"),
                "lift": float((mass / area).mean()) if len(got) else float("nan"),
                "spread": float(np.median([r["prior_spread"][kind] for r in got]))
                if len(got)
                else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=PRIOR_COLUMNS)


def sap_frame(records: Sequence[dict], conditions: Sequence[Condition]) -> pd.DataFrame:
    """Return the long table: one row per sample and condition (vanilla included)."""
    rows = []
    for r in records:
        base = {
            "sample_id": r["id"],
            "task": r["task"],
            "gold": r["gold"],
            "vanilla_correct": r["vanilla"]["correct"],
        }
        blank = {"prior": "", "layers": "", "heads": "", "convention": ""}
        rows.append({**base, "condition": "vanilla", **blank, **r["vanilla"]})
        for c in conditions:
            setting = {"prior": c.prior, "layers": c.layers, "heads": c.heads, "convention": c.convention}
            rows.append({**base, "condition": c.name, **setting, **r["conditions"][c.name]})
    return pd.DataFrame(rows)


def accuracy_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Return accuracy (95 % Wilson interval), change against vanilla and share of changed answers per condition."""
    out = []
    vanilla = frame[frame["condition"] == "vanilla"].set_index("sample_id")
    base = float(vanilla["correct"].mean()) if len(vanilla) else float("nan")
    for name, part in frame.groupby("condition", sort=False):
        n, k = len(part), int(part["correct"].sum())
        low, high = interval(k, n)
        same = (
            part.set_index("sample_id")["prediction"]
            == vanilla["prediction"].reindex(part["sample_id"]).values
        )
        out.append(
            {
                "condition": name,
                "n": n,
                "correct": k,
                "accuracy": k / n if n else float("nan"),
                "ci_low": low,
                "ci_high": high,
                "delta_vs_vanilla": (k / n - base) if n else float("nan"),
                "changed_answers": float(1 - same.mean()) if n else float("nan"),
            }
        )
    return pd.DataFrame(out)


def key_region_table(records: Sequence[dict]) -> pd.DataFrame:
    """Return the mean key-region ratio and area prior for correctly / incorrectly answered samples."""
    df = pd.DataFrame(
        [{"correct": r["vanilla"]["correct"], "ratio": r["key_ratio"], "area": r["area"]} for r in records]
    )
    out = []
    for group, part in (
        (("correct", df[df["correct"]]), ("incorrect", df[~df["correct"]]), ("all", df)) if len(df) else ()
    ):
        part = part.dropna()
        out.append(
            {
                "group": group,
                "n": len(part),
                "key_ratio": part["ratio"].mean() if len(part) else float("nan"),
                "area_prior": part["area"].mean() if len(part) else float("nan"),
                "lift": (part["ratio"] / part["area"]).mean() if len(part) else float("nan"),
            }
        )
    return pd.DataFrame(out, columns=["group", "n", "key_ratio", "area_prior", "lift"])


def sap(
    m: Loaded,
    data: str | Path,
    *,
    priors: Sequence[str] = PRIORS,
    layers: Sequence[str] = ("late",),
    heads: str = "all",
    convention: str = "mass",
    prior_temperature: float = 1.0,
    scorer: str = "auto",
    max_new_tokens: int = 8,
    seed: int = 0,
    ctx: RunContext | None = None,
    **context,
) -> SapResult:
    """Evaluate `m` on `data` unmodified and under each (prior, layer set); with `ctx.out`, write a run dir.

    `ctx` is the run (`RunContext`); its fields may also be given as keywords (`out=`, `skip_bad=`, ...).
    """
    ctx = RunContext.of(ctx, **context)
    for p in priors:
        if p not in PRIORS + CONTROLS:
            raise CorelensError(f"unknown prior {p!r}; expected one of {PRIORS + CONTROLS}")
    if convention not in CONVENTIONS:
        raise CorelensError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
    if not prior_temperature > 0:
        raise CorelensError(f"--prior-temperature must be positive, got {prior_temperature}")
    for spec in layers:
        parse_layers(spec, m.num_layers)  # fail before any sample runs
    parse_heads(heads, m.num_heads)
    conditions = [Condition(p, spec, heads, convention) for p in priors for spec in layers]
    samples, skipped = ctx.read(data)
    run = None
    if ctx.out is not None:
        settings = {
            **model_data_settings(m, data),
            "priors": list(priors),
            "layers": list(layers),
            "heads": heads,
            "convention": convention,
            "prior_temperature": prior_temperature,
            "scorer": scorer,
            "max_new_tokens": max_new_tokens,
            "limit": ctx.limit,
            "skip_bad": ctx.skip_bad,
            "seed": seed,
        }
        run = ctx.open("sap", settings, device=m.device)

    def step(sample: Sample, done: set[str], prepared: Prepared) -> list[dict]:
        record = measure_sample(
            m,
            sample,
            conditions,
            scorer=scorer,
            max_new_tokens=max_new_tokens,
            seed=seed,
            temperature=prior_temperature,
            prepared=prepared,
        )
        return [record]

    loop = Loop("sap", step, length=partial(prompt_length, m), prepare=partial(prepare, m))
    records = ctx.drive(loop, samples, run, skipped)
    ok = [r for r in records if r.get("status") == "ok"]
    frame = sap_frame(ok, conditions)
    result = SapResult(frame, accuracy_table(frame), key_region_table(ok), prior_table(ok, prior_temperature))

    def draw(paths: dict[str, Path]) -> None:
        from corelens.report.geometry import sap_accuracy

        sap_accuracy(result.accuracy, paths["sap_accuracy"])

    tables = {
        "frame": frame,
        "accuracy": result.accuracy,
        "key_region": result.key_region,
        "priors": result.priors,
    }
    n_skipped = sum(1 for r in records if r.get("status") == "skipped")
    conclude(run, SAP, tables, draw=draw, samples=len(ok), skipped=n_skipped)
    return result


def sap_path(
    model: str | Path, data: str | Path, out: str | Path, *, load_options: dict | None = None, **kwargs
) -> SapResult:
    """Load `model` (with `load()`'s `load_options`) and run the SAP sweep on `data` into run directory `out`."""
    return sap(load(model, **(load_options or {})), data, out=out, **kwargs)


def run_command(config, ctx: RunContext, load_options: dict) -> SapResult:
    """`corelens sap`: the config's (`SapConfig`) model loaded, `sap` run on its data under `ctx`."""
    return run_loaded(sap, config, ctx, load_options)
