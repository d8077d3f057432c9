"""`greedy`: a joint head selection that grows the kept set one head at a time (docs/methods.md#greedy).

The value of a set H is the mean over the samples of the gold answer's log-probability, teacher-forced
(`experiments.importance.answer_logp`), with H applied through the registered policies:

- mode "hybrid": `HybridAttention(full=H, sink=S, window=W)`: the heads of H keep full attention, every
  other head streams; starting from H = {} (every head streams), each step adds the head whose addition
  raises the value most (its gain: value(H + h) - value(H));
- mode "ablate": `ZeroHeads(H)`: the heads of H are zeroed; starting from H = {}, each step adds the head
  whose zeroing, with H's, lowers the value most (its gain: value(H) - value(H + h), the loss it adds).

It stops at `budget` heads. The score of a head is its selection order (1 first) and its gain; heads never
selected have none. Ties go to the lower (layer, head). `candidates` narrows the pool. With `granularity`
"kv" the units selected are KV heads (layer, KV head): a unit in H puts all the query heads of its KV group
in the set, so the selection is made among whole KV heads, as a trimmed cache keeps them.

Evaluation: `batch` = 0 evaluates one set per forward through the policies themselves (`set_value`); `batch`
= B (the default) evaluates the candidate sets of one step B at a time, as B copies of one sample in one
forward, each copy with its own set: per-copy gates at 0 or 1 on `attention.gating.GateHook` (hybrid: exactly
full or streaming per head) or on `attention.attribution.HeadGate` (zero: each head's output times 1 - s).
Both equal the policies' values (tests/test_greedy.py); batching shares the per-forward overhead that
dominates small models. Each sample's teacher-forced inputs are prepared once.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from corelens.attention.attribution import HeadGate
from corelens.attention.gating import gated
from corelens.data.sample import Sample
from corelens.errors import InputError, OptionError
from corelens.experiments.importance import answer_logp
from corelens.models.prepare import Prepared, prepare
from corelens.policies import HybridAttention, Policy, ZeroHeads
from corelens.runs.dist import Dist
from corelens.runs.dist import current as current_launch
from corelens.runs.files import read_bytes, write_text

MODES = ("hybrid", "ablate")
GRANULARITIES = ("query", "kv")
CHECKPOINT = "greedy.json"

Head = tuple[int, int]


@dataclass(frozen=True)
class GreedySettings:
    """What `greedy_heads` maximises and how far (module docstring)."""

    mode: str = "hybrid"
    budget: int = 8
    sink: int = 4  # hybrid mode's streaming budget
    window: int = 16
    candidates: tuple[Head, ...] | None = None  # None: every head of the model
    batch: int = 32  # candidate sets per forward (copies of one sample); 0: one set per forward, by policy
    granularity: str = "query"  # the unit: a query head, or a KV head ("kv": its group of query heads)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise OptionError(f"greedy: unknown mode {self.mode!r}; expected one of {MODES}")
        if self.granularity not in GRANULARITIES:
            raise OptionError(
                f"greedy: unknown granularity {self.granularity!r}; expected one of {GRANULARITIES}"
            )
        if self.budget < 1 or self.batch < 0:
            raise OptionError(
                f"greedy: need a budget >= 1 head and batch >= 0, got {self.budget}, {self.batch}"
            )

    def policy(self, heads: Sequence[Head]) -> Policy:
        """Return the policy that applies the set `heads` in this mode."""
        if self.mode == "hybrid":
            return HybridAttention(full=tuple(heads), sink=self.sink, window=self.window)
        return ZeroHeads(heads=tuple(heads))


@dataclass
class GreedyResult:
    """The heads in selection order (KV heads with granularity "kv"), each one's gain, and the set's value
    after each step."""

    order: list[Head]
    gains: list[float]
    values: list[float]  # value of the set after each step
    base: float  # value of the empty set
    settings: GreedySettings
    evaluations: int = 0  # set evaluations made (each over every sample)
    extra: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """Return one row per selected head: rank (1 first), layer, head (kv_head for KV units), gain, value."""
        column = "head" if self.settings.granularity == "query" else "kv_head"
        return pd.DataFrame(
            {
                "rank": np.arange(1, len(self.order) + 1),
                "layer": [h[0] for h in self.order],
                column: [h[1] for h in self.order],
                "gain": self.gains,
                "value": self.values,
            }
        )


def set_value(m: Any, items: Sequence[tuple[Sample, Prepared]], policy: Policy) -> float:
    """Return the mean log p(gold answer) over the teacher-forced samples under `policy`."""
    total = 0.0
    with torch.no_grad():
        for sample, forced in items:
            with policy.applied(m, forced, sample=sample):
                total += float(answer_logp(m, forced))
    return total / len(items)


ENCODED = {
    "image": ("pixel_values", "get_image_features"),
    "video": ("pixel_values_videos", "get_video_features"),
}


def encoded(m: Any, forced: Prepared) -> dict:
    """Return the prompt's inputs with the vision tower's output in place of the pixels, when the model takes
    it (`mm_encoder_outputs`, transformers' Qwen2.5-VL): copies of a sample then share one vision pass."""
    inner = getattr(m.model, "model", None)
    inputs = dict(forced.inputs)
    if inner is None or "mm_encoder_outputs" not in inspect.signature(inner.forward).parameters:
        return inputs
    outputs = {}
    with torch.no_grad():
        for kind, (key, method) in ENCODED.items():
            if inputs.get(key) is not None:
                grid = inputs[f"{kind}_grid_thw"].to(m.device)
                pixels = inputs.pop(key).to(m.device)
                outputs[kind] = getattr(inner, method)(pixels, grid, return_dict=True)
    if outputs:
        inputs["mm_encoder_outputs"] = outputs
    return inputs


def _copies(inputs: dict, n: int) -> dict:
    """Return `n` copies of one processed prompt as one batch (ids, masks, patches, grids concatenated)."""
    out = {}
    for key, value in inputs.items():
        if key == "mm_encoder_outputs":
            out[key] = {kind: _repeat_pooled(o, n) for kind, o in value.items()}
        elif isinstance(value, torch.Tensor):
            out[key] = torch.cat([value] * n)
        elif isinstance(value, list):
            out[key] = value * n
        else:
            out[key] = value
    return out


def _repeat_pooled(output: Any, n: int) -> Any:
    """Return a vision output whose per-image `pooler_output` list is repeated for `n` copies."""
    return type(output)(pooler_output=list(output.pooler_output) * n)


def _rows_logp(m: Any, inputs: dict, forced: Prepared) -> torch.Tensor:
    """Return log p(gold answer) of every copy in `inputs` (fp64, as `importance.answer_logp` per copy)."""
    rows = forced.answer_rows
    keep = forced.seq_len - int(rows[0]) + 1
    inputs = {k: v.to(m.device) if hasattr(v, "to") else v for k, v in inputs.items()}
    logits = m.model(**inputs, use_cache=False, logits_to_keep=keep).logits[:, :-1].double()
    ids = inputs["input_ids"][0, torch.as_tensor(rows, device=inputs["input_ids"].device)].to(logits.device)
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, ids.view(1, -1, 1).expand(logp.shape[0], -1, 1)).sum(dim=(1, 2))


def batched_values(
    m: Any,
    items: Sequence[tuple[Sample, Prepared, dict]],
    sets: Sequence[Sequence[Head]],
    settings: GreedySettings,
) -> list[float]:
    """Return each set's mean log p(gold answer), `settings.batch` sets per forward (module docstring).

    `items`: (sample, teacher-forced prompt, its inputs as `encoded` returns them).
    """
    totals = np.zeros(len(sets))
    shape = (m.num_layers, m.num_heads)
    for start in range(0, len(sets), settings.batch):
        part = sets[start : start + settings.batch]
        marks = torch.zeros((len(part), *shape), dtype=torch.float32)
        for row, heads in enumerate(part):
            for layer, head in heads:
                marks[row, layer, head] = 1.0
        for _, forced, inputs in items:
            with torch.no_grad():
                if settings.mode == "hybrid":
                    hook = gated(m, marks, sink=settings.sink, window=settings.window)
                else:
                    gate = HeadGate(m, "zero", batch=len(part))
                    gate.gates.copy_(marks)
                    hook = gate.installed()
                with hook:
                    logp = _rows_logp(m, _copies(inputs, len(part)), forced)
            totals[start : start + len(part)] += logp.cpu().numpy()
    return (totals / len(items)).tolist()


def greedy_heads(
    m: Any,
    samples: list[Sample],
    settings: GreedySettings | None = None,
    *,
    value: Callable[[Sequence[Head]], float] | None = None,
    folder: str | Path | None = None,
    dist: Dist | None = None,
    progress: bool = False,
) -> GreedyResult:
    """Grow the kept set greedily over `samples` (each with its answer); return the order and the gains.

    `value`, when given, replaces the policy evaluation of a set of query heads (the samples are then not
    read). With `settings.granularity` "kv", `candidates` and the result's `order` are KV heads. `folder`:
    each step's choice is saved there (`greedy.json`, by rank 0) and a later call resumes after
    the last saved step.

    Examples:
        >>> from corelens.organism import quickstart
        >>> m, samples = quickstart(getfixture("tmp_path"), 2)
        >>> pool = ((0, 5), (0, 6), (1, 0))
        >>> r = greedy_heads(m, samples, GreedySettings(budget=2, sink=2, window=4, candidates=pool))
        >>> len(r.order), r.evaluations  # 3 + 2 candidate sets, and the empty set
        (2, 6)
    """
    settings = settings or GreedySettings()
    dist = dist or current_launch()
    if value is None:
        missing = [s.id for s in samples if s.answer is None]
        if missing:
            raise InputError("greedy scores the gold answer: this sample has none", sample=missing[0])
        if not samples:
            raise InputError("greedy: no sample to score")
        # Under torchrun each rank scores its share of the samples; the sums are added over the ranks.
        items = [(s, prepare(m, s, answer=s.answer)) for s in samples[dist.rank :: dist.world]]
        if settings.batch:
            encoded_items = [(s, f, encoded(m, f)) for s, f in items]
            mine = partial(batched_values, m, encoded_items, settings=settings)
        else:

            def mine(sets: Sequence[Sequence[Head]]) -> list[float]:
                return [set_value(m, items, settings.policy(h)) for h in sets]

        def values_of(sets: Sequence[Sequence[Head]]) -> list[float]:
            sums = (
                torch.tensor(mine(sets), dtype=torch.float64) * len(items)
                if items
                else torch.zeros(len(sets), dtype=torch.float64)
            )
            if dist.world > 1:
                import torch.distributed as tdist

                tdist.all_reduce(sums)
            return (sums / len(samples)).tolist()

    else:
        values_of = lambda sets: [value(h) for h in sets]  # noqa: E731

    kv = settings.granularity == "kv"
    group = m.num_heads // m.num_kv_heads if kv else 1
    units = m.num_kv_heads if kv else m.num_heads
    pool = list(settings.candidates) if settings.candidates is not None else [
        (layer, unit) for layer in range(m.num_layers) for unit in range(units)
    ]  # fmt: skip

    def heads_of(chosen: Sequence[Head]) -> tuple[Head, ...]:
        """Return the query heads of the units `chosen` (a KV head: its group's query heads)."""
        return tuple((layer, unit * group + j) for layer, unit in chosen for j in range(group))

    pool = sorted({(int(a), int(b)) for a, b in pool})
    sign = 1.0 if settings.mode == "hybrid" else -1.0
    chosen: list[Head] = []
    gains: list[float] = []
    values: list[float] = []
    path = None if folder is None else Path(folder) / CHECKPOINT
    saved = json.loads(read_bytes(path)) if path is not None and path.is_file() else None
    if saved is not None:
        chosen = [tuple(h) for h in saved["order"]]
        gains, values, base, evaluations = (
            saved["gains"],
            saved["values"],
            saved["base"],
            saved["evaluations"],
        )
        current = values[-1] if values else base
    else:
        base = current = values_of([()])[0]
        evaluations = 1
    for step in range(len(chosen), min(settings.budget, len(pool))):
        left = [head for head in pool if head not in chosen]
        vs = values_of([heads_of([*chosen, head]) for head in left])
        evaluations += len(left)
        best, best_value = None, None
        for head, v in zip(left, vs, strict=True):
            if best_value is None or sign * (v - best_value) > 0:
                best, best_value = head, v
        gains.append(sign * (best_value - current))
        chosen.append(best)
        values.append(best_value)
        current = best_value
        if path is not None and dist.main:
            path.parent.mkdir(parents=True, exist_ok=True)
            state = {
                "order": chosen,
                "gains": gains,
                "values": values,
                "base": base,
                "evaluations": evaluations,
            }
            write_text(path, json.dumps(state), root=path.parent)
        if progress:
            print(f"greedy step {step + 1}: L{best[0]}H{best[1]} gain {gains[-1]:.4f}", flush=True)
    return GreedyResult(chosen, gains, values, base, settings, evaluations)
