"""Annotation-free Omega: each sample's evidence tokens estimated from the model itself (docs/methods.md#causal-omega).

Both estimators score the visual cells of a prompt by how much the log-probability of the model's own greedy
answer depends on them, and keep the cells that score at least `ratio` x the best score:
- `occlusion`: a cell's score is the drop in that log-probability when its pixels are painted the blank
  control's grey (`prepare.blank_like`). Cells are first occluded in coarse blocks (`grid` x `grid` per
  segment), then the `refine` blocks with the largest drops cell by cell, `batch` copies per forward: at
  most grid² x segments + refine x (cells per block) forwards.
- `gradient`: gradient x input on the visual token embeddings (the first decoder layer's input), against
  the blank control's embeddings as the baseline: sum_d ∂log p/∂e_td · (e_td − blank_td), the first-order
  estimate of the same drop, from one forward and one backward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import ImageDraw

from corelens.capture import decoder_layers
from corelens.data.sample import Sample, load_images, load_video
from corelens.errors import InputError
from corelens.layout import Segment
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare

ESTIMATORS = ("occlusion", "gradient")
GREY = (128, 128, 128)  # the blank control's grey (prepare.blank_like)


@dataclass(frozen=True)
class OmegaSettings:
    """Estimator and its settings (recorded in the rank manifest)."""

    estimator: str = "occlusion"
    grid: int = 4  # coarse blocks per segment side (occlusion)
    refine: int = 2  # coarse blocks refined cell by cell (occlusion)
    ratio: float = 0.5  # keep cells scoring >= ratio x the best cell
    batch: int = 8  # occluded copies per forward
    max_new_tokens: int = 8  # the model's own answer

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise InputError(f"unknown Omega estimator {self.estimator!r}; expected one of {ESTIMATORS}")
        if self.grid < 1 or self.refine < 1 or self.batch < 1 or self.max_new_tokens < 1:
            raise InputError("--omega-grid, --omega-refine, --omega-batch and max_new_tokens must be >= 1")
        if not 0.0 < self.ratio <= 1.0:
            raise InputError(f"--omega-ratio must be in (0, 1], got {self.ratio}")

    def to_json(self) -> dict:
        """Return the settings as a manifest entry."""
        return asdict(self)

    def cost(self) -> str:
        """Return what estimating one sample's Omega runs, in words (the module docstring's bound).

        Examples:
            >>> OmegaSettings().cost()
            "per sample its greedy answer (up to 8 tokens), then per picture up to 16 occluded blocks and 2 blocks' cells one by one, 8 copies per forward"
            >>> OmegaSettings("gradient").cost()
            'per sample its greedy answer (up to 8 tokens), then one forward and one backward'
        """
        head = f"per sample its greedy answer (up to {self.max_new_tokens} tokens), then "
        if self.estimator == "gradient":
            return head + "one forward and one backward"
        return head + (f"per picture up to {self.grid**2} occluded blocks and {self.refine} blocks' cells one by "
                       f"one, {self.batch} copies per forward")  # fmt: skip


def _device_inputs(m: Loaded, inputs: dict) -> dict:
    """A batch of inputs (not one `Prepared`, whose `to` moves its own) on the model's device."""
    return {k: v.to(m.device) if hasattr(v, "to") else v for k, v in inputs.items()}


def own_answer(m: Loaded, prepared: Prepared, max_new_tokens: int = 8) -> torch.Tensor:
    """Return the token ids of the model's greedy answer, up to its first special token (at least one id)."""
    inputs = prepared.to(m.device)
    with torch.no_grad():
        out = m.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].cpu()
    special = torch.tensor(m.processor.tokenizer.all_special_ids, dtype=new.dtype)
    stop = torch.nonzero(torch.isin(new, special))
    # An answer that starts with a special token (an empty reply) is scored on that token.
    end = int(stop[0, 0]) if len(stop) else len(new)
    return new[: max(end, 1)]


def _batch(inputs: list[dict], answer: torch.Tensor) -> dict:
    """Concatenate processed copies along dim 0 (ids, masks, patches, grids) and append the answer ids."""
    out = {}
    for key in inputs[0]:
        values = [x[key] for x in inputs]
        out[key] = torch.cat(values) if isinstance(values[0], torch.Tensor) else sum(map(list, values), [])
    tail = answer.unsqueeze(0).expand(len(inputs), -1).to(out["input_ids"].dtype)
    shape = out["input_ids"].shape
    for key, value in out.items():
        if key == "input_ids" or not isinstance(value, torch.Tensor) or value.shape != shape:
            continue
        # Per-token companions of the ids: the mask attends to the answer, token types mark it as text (0).
        fill = torch.ones_like if key == "attention_mask" else torch.zeros_like
        out[key] = torch.cat([value, fill(tail).to(value.dtype)], dim=1)
    out["input_ids"] = torch.cat([out["input_ids"], tail], dim=1)
    return out


def answer_logprob(
    m: Loaded, inputs: list[dict], answer: torch.Tensor, embeds: torch.Tensor | None = None
) -> torch.Tensor:
    """Return log p(answer | prompt) of each processed copy in `inputs` (one batched forward).

    `embeds` (seq, hidden), if given, replaces the first decoder layer's input (one copy only): the
    function the gradient estimator differentiates.
    """
    batched = _device_inputs(m, _batch(inputs, answer))
    n = len(answer)
    handle = None
    if embeds is not None:

        def swap(module, args, kwargs):
            # The layer's input is the embedded prompt; the answer's rows are left as the model made them.
            hidden = args[0] if args else kwargs["hidden_states"]
            hidden = torch.cat([embeds.unsqueeze(0).to(hidden.dtype), hidden[:, embeds.shape[0] :]], dim=1)
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        handle = decoder_layers(m)[0].register_forward_pre_hook(swap, with_kwargs=True)
    try:
        logits = m.model(**batched, use_cache=False, logits_to_keep=n + 1).logits[:, :-1].double()
    finally:
        if handle is not None:
            handle.remove()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, answer.to(logp.device).view(1, n, 1).expand(logp.shape[0], n, 1)).sum(dim=(1, 2))


def first_layer_input(m: Loaded, prepared: Prepared) -> torch.Tensor:
    """Return the first decoder layer's input (seq, hidden) for the prompt: the token embeddings."""
    seen = {}

    def keep(module, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"])[0].detach()

    handle = decoder_layers(m)[0].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return seen["x"]


def input_gradient(m: Loaded, prepared: Prepared, answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the prompt embeddings (seq, hidden) and the gradient of log p(answer) with respect to them."""
    embeds = first_layer_input(m, prepared).clone().requires_grad_(True)
    with torch.enable_grad():
        answer_logprob(m, [prepared.inputs], answer, embeds=embeds).sum().backward()
    return embeds.detach(), embeds.grad.detach()


def _cells(seg: Segment) -> list[tuple[int, int]]:
    """Return the (row, col) cells of a segment that show image pixels (padding-only cells dropped)."""
    r, c = np.nonzero(~seg.padding_cells())
    return list(zip(r.tolist(), c.tolist()))


def _occluded(images: list, frames: list, seg: Segment, cells: list[tuple[int, int]]) -> tuple[list, list]:
    """Return copies of the visuals with the pixels of `cells` of `seg` painted grey."""
    xs, ys = seg.cell_spans()
    images, frames = list(images), list(frames)
    targets = [(images, seg.source)] if seg.kind == "image" else [(frames, f) for f in seg.frames]
    for store, index in targets:
        canvas = store[index].copy()
        draw = ImageDraw.Draw(canvas)
        for r, c in cells:
            draw.rectangle(
                [xs[c, 0], ys[r, 0], np.nextafter(xs[c, 1], -np.inf), np.nextafter(ys[r, 1], -np.inf)],
                fill=GREY,
            )
        store[index] = canvas
    return images, frames


def _drops(m, sample, settings, base_inputs, base, answer, jobs, images, frames) -> np.ndarray:
    """Return the log-probability drop of each job (segment, cells), `settings.batch` copies per forward."""
    drops = []
    for start in range(0, len(jobs), settings.batch):
        chunk = jobs[start : start + settings.batch]
        copies = []
        for seg, cells in chunk:
            visuals = _occluded(images, frames, seg, cells)
            inputs = prepare(m, sample, visuals=visuals).inputs
            if inputs["input_ids"].shape != base_inputs["input_ids"].shape:
                raise InputError("an occluded copy tokenizes differently from the prompt", sample=sample.id)
            copies.append(inputs)
        with torch.no_grad():
            drops.extend((base - answer_logprob(m, copies, answer)).cpu().tolist())
    return np.asarray(drops)


def _keep(tokens: np.ndarray, scores: np.ndarray, ratio: float) -> np.ndarray:
    """Return the tokens scoring > 0 and >= ratio x the best score (sorted)."""
    if not len(scores) or scores.max() <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(tokens[(scores > 0) & (scores >= ratio * scores.max())]).astype(np.int64)


def occlusion_scores(
    m: Loaded, sample: Sample, settings: OmegaSettings, prepared: Prepared, answer: torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Return the refined cells' token positions and their log-probability drops (coarse, then refined)."""
    images = load_images(sample)
    frames = load_video(sample)[0] if sample.video is not None else []
    with torch.no_grad():
        base = answer_logprob(m, [prepared.inputs], answer)[0]
    coarse = []
    for seg in prepared.layout.segments:
        cells = _cells(seg)
        rows = np.array_split(np.arange(seg.rows), min(settings.grid, seg.rows))
        cols = np.array_split(np.arange(seg.cols), min(settings.grid, seg.cols))
        for rr in rows:
            for cc in cols:
                block = [(r, c) for r, c in cells if r in rr and c in cc]
                if block:
                    coarse.append((seg, block))
    drops = _drops(m, sample, settings, prepared.inputs, base, answer, coarse, images, frames)
    chosen = [coarse[i] for i in np.argsort(-drops, kind="stable")[: settings.refine]]
    fine = [(seg, [cell]) for seg, block in chosen for cell in block]
    fine_drops = _drops(m, sample, settings, prepared.inputs, base, answer, fine, images, frames)
    tokens = np.array([int(seg.token(*cells[0])) for seg, cells in fine], dtype=np.int64)
    return tokens, fine_drops


def gradient_scores(m: Loaded, sample: Sample, prepared: Prepared, answer: torch.Tensor) -> tuple:
    """Return the visual cells' token positions and their gradient x (input - blank) scores."""
    embeds, grad = input_gradient(m, prepared, answer)
    blank = first_layer_input(m, prepare(m, sample, blank=True))
    if blank.shape != embeds.shape:
        raise InputError("the blank control tokenizes differently from the prompt", sample=sample.id)
    tokens = np.unique(
        np.concatenate([[int(s.token(r, c)) for r, c in _cells(s)] for s in prepared.layout.segments])
    ).astype(np.int64)
    index = torch.from_numpy(tokens).to(embeds.device)
    scores = (grad[index].double() * (embeds[index] - blank[index]).double()).sum(dim=-1)
    return tokens, scores.cpu().numpy()


def estimate_omega(
    m: Loaded,
    sample: Sample,
    settings: OmegaSettings,
    padding: str = "visual",
    prepared: Prepared | None = None,
) -> tuple[np.ndarray, str]:
    """Return the estimated Omega of `sample` (sorted token positions) and the model's own answer.

    `prepared` is the sample's prompt as the caller prepared it (without a teacher-forced answer); the
    occluded and blank copies are prepared here, one per copy.
    """
    prepared = prepared if prepared is not None else prepare(m, sample, padding=padding)
    if not prepared.layout.segments:
        raise InputError("the sample has no visual tokens to estimate Omega on", sample=sample.id)
    answer = own_answer(m, prepared, settings.max_new_tokens)
    if settings.estimator == "occlusion":
        tokens, scores = occlusion_scores(m, sample, settings, prepared, answer)
    else:
        tokens, scores = gradient_scores(m, sample, prepared, answer)
    omega = np.intersect1d(_keep(tokens, scores, settings.ratio), prepared.layout.visual)
    return omega, m.processor.tokenizer.decode(answer, skip_special_tokens=True).strip()
