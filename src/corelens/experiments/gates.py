"""`gates`: DuoAttention's optimisation of one gate per head on the user's own data (docs/methods.md#gates).

Each head's output is alpha * full + (1 - alpha) * streaming attention (`attention.gating`: S sinks + a window
of W keys, the hybrid rule), the model's weights frozen. Every sample is teacher-forced (`prepare(...,
answer=...)`) and the loss of one step, over its batch of samples, is

    distance(gated model, dense model at the answer rows) + lambda * mean(alpha)

with `loss` "hidden" (DuoAttention): the final hidden states' squared L2 distance divided by the hidden size
(mean squared error over the hidden dimension), averaged over the answer rows; or "logp": the gold answer's
negative log-likelihood under the gated model minus the dense model's (the excess NLL; the dense part is a
constant, so the gradient is that of the NLL). Adam updates alpha (fp32 whatever the model's dtype), which
is clamped to [0, 1] after each step. Gates start at 1 (the dense model), as in DuoAttention.

Granularity "query": one gate per query head; "kv": one per KV head, shared by its query heads (DuoAttention's).
The score of a head is its learned alpha; `binarize` turns alphas into a full set by DuoAttention's quantile
rule, `top` by a count. Resumable: after every `save_every` steps the gates, the optimiser state, the step
and the loss rows go to `gates.pt` in the run folder; a run restarted with the same settings continues from
there and ends with the alphas an uninterrupted run gives. Under torchrun each rank takes its share of each
step's batch and the gradients are summed over the ranks (`torch.distributed.all_reduce` on the CPU copy of
the gates' gradient, the gloo group `runs.dist` joins), so every rank takes the same step.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from corelens.attention.gating import gated
from corelens.data.sample import Sample
from corelens.errors import CorelensError, InputError, OptionError
from corelens.experiments.importance import answer_logp
from corelens.models.prepare import Prepared, prepare
from corelens.runs.dist import Dist, current
from corelens.runs.files import read_bytes, writer

LOSSES = ("hidden", "logp")
GRANULARITIES = ("query", "kv")
CHECKPOINT = "gates.pt"


@dataclass(frozen=True)
class GateSettings:
    """What `fit_gates` optimises and how (module docstring)."""

    sink: int = 4
    window: int = 16
    loss: str = "hidden"  # "hidden" (DuoAttention) or "logp"
    granularity: str = "query"  # "query" or "kv"
    lam: float = 0.05  # lambda, the weight of mean(alpha)
    lr: float = 0.02
    epochs: int = 2
    batch: int = 4  # samples per step (over all ranks)
    seed: int = 0  # the sample order of each epoch
    save_every: int = 1  # steps between checkpoints

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise OptionError(f"gates: unknown loss {self.loss!r}; expected one of {LOSSES}")
        if self.granularity not in GRANULARITIES:
            raise OptionError(
                f"gates: unknown granularity {self.granularity!r}; expected one of {GRANULARITIES}"
            )
        if self.epochs < 1 or self.batch < 1 or self.save_every < 1 or self.lr <= 0 or self.lam < 0:
            raise OptionError("gates: need epochs, batch, save_every >= 1, lr > 0 and lam >= 0")


@dataclass
class GateResult:
    """Learned gates (layers, heads or kv heads) and one row per step of the loss curve."""

    alpha: np.ndarray
    losses: pd.DataFrame
    settings: GateSettings
    steps: int = 0
    extra: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """Return one row per head (layer, head or kv_head, alpha), highest alpha first."""
        column = "head" if self.settings.granularity == "query" else "kv_head"
        layers, heads = self.alpha.shape
        frame = pd.DataFrame(
            {
                "layer": np.repeat(np.arange(layers), heads),
                column: np.tile(np.arange(heads), layers),
                "alpha": self.alpha.reshape(-1),
            }
        )
        return frame.sort_values("alpha", ascending=False, kind="stable").reset_index(drop=True)


def binarize(alpha: np.ndarray, sparsity: float, seed: int = 0) -> np.ndarray:
    """Return the full heads (booleans) by DuoAttention's rule: alpha >= the `sparsity` quantile of alpha.

    As DuoAttention's `sparsify_attention_heads`: a uniform noise below 1e-6 (seeded) breaks ties first;
    sparsity >= 1 keeps no head full, <= 0 every head.

    Examples:
        >>> binarize(np.array([[0.9, 0.1], [0.5, 0.7]]), 0.5).astype(int).tolist()
        [[1, 0], [0, 1]]
    """
    a = np.asarray(alpha, dtype=np.float64)
    a = a + np.random.default_rng(seed).uniform(0, 1e-6, a.shape)
    if sparsity >= 1:
        return np.zeros(a.shape, dtype=bool)
    if sparsity <= 0:
        return np.ones(a.shape, dtype=bool)
    return a >= np.quantile(a, sparsity)


def top(alpha: np.ndarray, k: int) -> list[tuple[int, int]]:
    """Return the `k` (layer, head) pairs of highest alpha (ties: lower layer, then lower head first)."""
    flat = np.asarray(alpha).reshape(-1)
    order = np.lexsort((np.arange(len(flat)), -flat))[:k]
    heads = np.asarray(alpha).shape[1]
    return [(int(i // heads), int(i % heads)) for i in order]


def _targets(m: Any, forced: Prepared, loss: str) -> torch.Tensor:
    """Return the dense model's reference: answer-row hidden states ("hidden") or log p(answer) ("logp")."""
    with torch.no_grad():
        if loss == "logp":
            return answer_logp(m, forced).detach()
        return _answer_hidden(m, forced).detach()


def _answer_hidden(m: Any, forced: Prepared) -> torch.Tensor:
    """Return the final hidden states (answer rows, hidden) in fp32 at least: transformers' last `hidden_states`."""
    out = m.model(**forced.to(m.device), use_cache=False, output_hidden_states=True, logits_to_keep=1)
    rows = torch.as_tensor(forced.answer_rows, device=out.hidden_states[-1].device)
    hidden = out.hidden_states[-1][0, rows]
    return hidden.to(torch.promote_types(hidden.dtype, torch.float32))


def distance(m: Any, forced: Prepared, target: torch.Tensor, loss: str) -> torch.Tensor:
    """Return the distance of the (gated) model to the dense `target` on one sample (module docstring)."""
    if loss == "logp":
        return target - answer_logp(m, forced)  # fp64
    hidden = _answer_hidden(m, forced)
    return (hidden - target.to(hidden.device)).pow(2).mean(dim=-1).mean()


def gate_distance(
    m: Any, forced: Prepared, target: torch.Tensor, alpha: torch.Tensor, settings: GateSettings
) -> torch.Tensor:
    """Return one sample's distance to the dense `target` under the gates `alpha` (layers, query heads)."""
    with gated(m, alpha, sink=settings.sink, window=settings.window):
        return distance(m, forced, target, settings.loss)


def expand(param: torch.Tensor, heads: int) -> torch.Tensor:
    """Return per-query-head gates (layers, heads) from per-KV-head ones (each shared by its group)."""
    return param.repeat_interleave(heads // param.shape[1], dim=1)


def order(n: int, settings: GateSettings, epoch: int) -> np.ndarray:
    """Return the sample order of one epoch (seeded by the settings' seed and the epoch)."""
    return np.random.default_rng([settings.seed, epoch]).permutation(n)


def _save(path, state: dict) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with writer(path, root=path.parent) as f:
        f.write(buffer.getvalue())


def _load(path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return torch.load(io.BytesIO(read_bytes(path)), weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unreadable checkpoint is the same one-line error
        raise CorelensError(
            f"{path}: cannot read the gates checkpoint ({err}); delete it to start afresh"
        ) from None


def fit_gates(
    m: Any,
    samples: list[Sample],
    settings: GateSettings | None = None,
    *,
    folder=None,
    dist: Dist | None = None,
    stop_after: int | None = None,
    progress: bool = False,
) -> GateResult:
    """Optimise the gates on `samples` (each with its answer); checkpoint in `folder` (None: no checkpoint).

    `stop_after` ends after that many steps in total (the checkpoint kept: a later call resumes), as a run
    killed there would.

    Examples:
        >>> from corelens.organism import quickstart
        >>> m, samples = quickstart(getfixture("tmp_path"), 2)
        >>> r = fit_gates(m, samples, GateSettings(epochs=1, batch=2, sink=2, window=4))
        >>> r.alpha.shape, len(r.losses), bool((r.alpha <= 1).all() and (r.alpha >= 0).all())
        ((4, 8), 1, True)
    """
    settings = settings or GateSettings()
    dist = dist or current()
    missing = [s.id for s in samples if s.answer is None]
    if missing:
        raise InputError("gates trains on the gold answer: this sample has none", sample=missing[0])
    if not samples:
        raise InputError("gates: no sample to train on")
    heads = m.num_heads
    width = heads if settings.granularity == "query" else m.num_kv_heads
    param = torch.ones(m.num_layers, width, dtype=torch.float32, device=m.device, requires_grad=True)
    optimizer = torch.optim.Adam([param], lr=settings.lr)
    per_epoch = math.ceil(len(samples) / settings.batch)
    total = per_epoch * settings.epochs
    rows: list[dict] = []
    step = 0
    path = None if folder is None else Path(folder) / CHECKPOINT
    if path is not None and dist.main:
        path.parent.mkdir(parents=True, exist_ok=True)
    state = None if path is None else _load(path)
    if state is not None:
        if state["world"] != dist.world:
            raise CorelensError(f"{path}: written by {state['world']} process(es), resumed by {dist.world}; "
                                "resume with the same number of ranks")  # fmt: skip
        with torch.no_grad():
            param.copy_(state["alpha"].to(param.device))
        optimizer.load_state_dict(state["optimizer"])
        step, rows = state["step"], state["rows"]
    forced: dict[int, Prepared] = {}
    targets: dict[int, torch.Tensor] = {}
    for p in m.model.parameters():
        p.requires_grad_(False)
    while step < total and (stop_after is None or step < stop_after):
        epoch, j = divmod(step, per_epoch)
        batch = order(len(samples), settings, epoch)[j * settings.batch : (j + 1) * settings.batch]
        mine = batch[dist.rank :: dist.world]
        optimizer.zero_grad(set_to_none=False)
        dist_sum = torch.zeros((), dtype=torch.float64)
        with torch.enable_grad():
            for i in mine:
                i = int(i)
                if i not in forced:
                    forced[i] = prepare(m, samples[i], answer=samples[i].answer)
                    targets[i] = _targets(m, forced[i], settings.loss)
                alpha = param if settings.granularity == "query" else expand(param, heads)
                d = gate_distance(m, forced[i], targets[i], alpha, settings)
                (d / len(batch)).backward()
                dist_sum += float(d.detach())
            reg = settings.lam * param.mean()
            if dist.main:  # once over the ranks, whose gradients are summed
                reg.backward()
        if dist.world > 1:
            _all_reduce(param, dist_sum)
        optimizer.step()
        with torch.no_grad():
            param.clamp_(0.0, 1.0)
        step += 1
        rows.append({
            "step": step, "epoch": epoch, "distance": float(dist_sum) / len(batch), "reg": float(reg.detach()),
            "loss": float(dist_sum) / len(batch) + float(reg.detach()), "mean_alpha": float(param.mean().detach()),
        })  # fmt: skip
        if progress and dist.main:
            print(f"gates step {step}/{total}: loss {rows[-1]['loss']:.5f}", flush=True)
        if path is not None and dist.main and (step % settings.save_every == 0 or step == total):
            _save(path, {"alpha": param.detach().cpu(), "optimizer": optimizer.state_dict(), "step": step,
                         "rows": rows, "world": dist.world, "settings": asdict(settings)})  # fmt: skip
    return GateResult(param.detach().cpu().numpy().astype(np.float64), pd.DataFrame(rows), settings, step)


def _all_reduce(param: torch.Tensor, dist_sum: torch.Tensor) -> None:
    """Sum the gates' gradient and the batch's distance over the ranks (in place; gloo, on the CPU)."""
    import torch.distributed as tdist

    grad = param.grad.detach().cpu().clone()
    tdist.all_reduce(grad)
    tdist.all_reduce(dist_sum)
    param.grad.copy_(grad.to(param.grad.device))
