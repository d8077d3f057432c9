"""Shared attention priors (SAP, docs/methods.md#sap): replace the visual part of the current query row's attention.

`SapHook` runs inside the corelens attention function. The kernel computes every row as usual; then, for the
current query rows only (the last prompt position in the prefill, each new token when decoding), the chosen
heads' attention rows are rebuilt from fp32 scores of those rows (one row per head, never N x N) and their
outputs overwritten. Conventions **[decision: mass]**:

- `mass`: the row's total visual mass m is kept and its visual part becomes m·π; text keys keep their
  probabilities exactly;
- `logits` (the authors' code): the visual pre-softmax scores are replaced by π itself (probabilities
  written as logits), text scores kept, then softmax — every prior becomes near-uniform attention;
- `mean_logits` (the authors' rescaled variant, as read here): the visual scores are replaced by π scaled to
  the row's mean visual score m = mean(s_V), m + |m|·(|V|·π_j − 1) (= π_j·|V|·m when m > 0; |m| is taken
  as 1 when m = 0), then softmax: the new visual scores keep their mean m and follow the order of π.

`prior=None` is the control "own": π is the row's own visual distribution, an exact no-op under `mass`.

Layers and heads are named sets (`parse_layers`, `parse_heads`): "all", lists and ranges ("21-27,29"),
"first:N" / "last:N", thirds ("early", "middle", "late"); heads also "band:P0-P1", the heads whose visual mass
in the current row lies in that percentile band of the layer (the authors' percentile band of heads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from corelens.attention.dispatch import AttentionCall, AttentionHook
from corelens.attention.probes import row_scores
from corelens.attention.prompt_context import AttentionContext, needs
from corelens.choices import CONVENTIONS
from corelens.deprecation import deprecated
from corelens.errors import CorelensError, OptionError


def _ranges(text: str, limit: int, what: str) -> tuple[int, ...]:
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi) if hi else int(lo)
        except ValueError:
            raise CorelensError(f"bad {what} set {text!r}: {part!r} is not N or N-M") from None
        if not 0 <= first <= last < limit:
            raise CorelensError(f"bad {what} set {text!r}: {part!r} is outside 0-{limit - 1}")
        out.update(range(first, last + 1))
    if not out:
        raise CorelensError(f"empty {what} set {text!r}")
    return tuple(sorted(out))


def parse_layers(spec: str, num_layers: int) -> tuple[int, ...]:
    """Return the layer indices of a named set: all, early/middle/late, first:N, last:N, or "21-27,29"."""
    spec = spec.strip()
    third = num_layers / 3
    named = {
        "all": range(num_layers),
        "early": range(0, round(third)),
        "middle": range(round(third), round(2 * third)),
        "late": range(round(2 * third), num_layers),
    }
    if spec in named:
        layers = tuple(named[spec])
        if not layers:
            raise CorelensError(f"layer set {spec!r} is empty for a {num_layers}-layer model")
        return layers
    for prefix in ("first:", "last:"):
        if spec.startswith(prefix):
            try:
                n = int(spec[len(prefix) :])
            except ValueError:
                raise CorelensError(f"bad layer set {spec!r}: expected {prefix}N") from None
            if not 0 < n <= num_layers:
                raise CorelensError(f"bad layer set {spec!r}: N must be in 1-{num_layers}")
            return tuple(range(n)) if prefix == "first:" else tuple(range(num_layers - n, num_layers))
    return _ranges(spec, num_layers, "layer")


@dataclass(frozen=True)
class SapHeads:
    """A named set of query heads: all, a fixed list, or a percentile band of the row's visual mass."""

    spec: str = "all"
    heads: tuple[int, ...] = ()
    band: tuple[float, float] | None = None

    def select(self, visual_mass: torch.Tensor) -> torch.Tensor:
        """Return a bool mask over heads for one query row, given each head's visual mass there."""
        n = visual_mass.shape[0]
        if self.band is not None:
            lo, hi = np.percentile(visual_mass.double().cpu().numpy(), self.band)
            return (visual_mass >= lo) & (visual_mass <= hi)
        chosen = torch.zeros(n, dtype=torch.bool, device=visual_mass.device)
        chosen[list(self.heads) if self.heads else slice(None)] = True
        return chosen


def parse_heads(spec: str, num_heads: int) -> SapHeads:
    """Return the head set of a spec: "all", "0-3,7", or "band:P0-P1" (percentiles of visual mass)."""
    spec = spec.strip()
    if spec == "all":
        return SapHeads(spec)
    if spec.startswith("band:"):
        try:
            lo, hi = (float(v) for v in spec[5:].split("-"))
        except ValueError:
            raise CorelensError(f"bad head set {spec!r}: expected band:P0-P1, e.g. band:25-75") from None
        if not 0 <= lo <= hi <= 100:
            raise CorelensError(f"bad head set {spec!r}: percentiles must satisfy 0 <= P0 <= P1 <= 100")
        return SapHeads(spec, band=(lo, hi))
    return SapHeads(spec, heads=_ranges(spec, num_heads, "head"))


def rebuild_rows(
    scores: torch.Tensor, visual: torch.Tensor, prior: torch.Tensor | None, convention: str = "mass"
) -> torch.Tensor:
    """Return new attention rows (b, heads, rows, kv) whose visual part follows `prior` under `convention`."""
    probs = torch.softmax(scores, dim=-1)
    vis = probs[..., visual]
    mass = vis.sum(-1, keepdim=True)
    if prior is None:
        pi = torch.where(mass > 0, vis / mass.clamp(min=1e-30), torch.full_like(vis, 1.0 / vis.shape[-1]))
    else:
        pi = prior.to(scores.device, torch.float32).expand_as(vis)
    if convention == "mass":
        out = probs.clone()
        out[..., visual] = mass * pi
        return out
    new_scores = scores.clone()
    if convention == "logits":
        new_scores[..., visual] = pi
    elif convention == "mean_logits":
        # The authors' intent: put π on the scale of the row's own visual scores, keeping their mean m (so
        # the row's visual / text balance stays near the model's) while the prior sets their order. Their
        # π·|V|·m inverts that order when m < 0; m + |m|·(|V|π − 1) is the same for m > 0 and keeps it.
        m = scores[..., visual].mean(-1, keepdim=True)
        scale = torch.where(m == 0, torch.ones_like(m), m.abs())  # m = 0: unit scale, not a flat prior
        new_scores[..., visual] = m + scale * (pi * pi.shape[-1] - 1)
    else:
        raise OptionError(f"unknown SAP convention {convention!r}; expected one of {CONVENTIONS}")
    return torch.softmax(new_scores, dim=-1)


PriorSource = Callable[[AttentionContext], Any]  # the prompt's context -> a prior over its visual tokens


@dataclass(eq=False)  # compared and hashed by identity: it keys its prompts' priors
class SapHook(AttentionHook):
    """Replaces the visual attention of the current query rows by a prior, in the heads of `heads`.

    The visual positions V and the prompt length (the current rows are prompt_len − 1 and later ones) are read
    from the call's context (`AttentionCall.context`), so one hook serves every prompt. `prior`: None (the
    row's own distribution), a distribution over V in position order, or a function of the context that
    returns one (None allowed), called once per prompt (`AttentionContext.derived`). Activate it on the
    layers of the set with `activate`. `record=True` keeps (layer, before, after, heads).

    Deprecated (kept for one release): `SapHook(visual, prior, prompt_len)` with the positions given to the
    constructor; they then override the context's.
    """

    kind: ClassVar[str] = "pattern"  # it rewrites the chosen heads' attention rows
    name: ClassVar[str] = "SAP"

    visual: torch.Tensor | None = None  # deprecated: the context's visual positions
    prior: torch.Tensor | PriorSource | None = None
    prompt_len: int | None = None  # deprecated: the context's prompt length
    heads: SapHeads = field(default_factory=SapHeads)
    convention: str = "mass"
    record: bool = False
    records: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise OptionError(f"unknown SAP convention {self.convention!r}; expected one of {CONVENTIONS}")
        if (self.visual is None) != (self.prompt_len is None):
            raise OptionError(
                "SapHook: give both visual and prompt_len (deprecated), or neither (the context's)"
            )
        if self.visual is not None:
            deprecated(
                "SapHook(visual, prior, prompt_len)",
                "SapHook(prior=...), which reads the positions from the call's context (apply "
                "`corelens.policies.SharedPrior`, or activate it inside "
                "`attention_context(AttentionContext.of(prepared))`)",
            )
            self.visual = torch.as_tensor(self.visual, dtype=torch.long)
        if self.prior is not None and not callable(self.prior):
            self.prior = self._checked(self.prior, self.visual)

    @staticmethod
    def _checked(prior: Any, visual: torch.Tensor | None) -> torch.Tensor:
        """Return `prior` as float32, checked against the visual tokens it weighs (when known)."""
        prior = torch.as_tensor(np.asarray(prior, dtype=np.float32) if not torch.is_tensor(prior) else prior)
        prior = prior.to(torch.float32)
        if visual is not None and prior.shape != visual.shape:
            raise OptionError(f"prior has {prior.numel()} values for {visual.numel()} visual tokens")
        return prior

    def prompt(self, call_context: AttentionContext | None) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """Return (visual positions, prompt length, prior) of the prompt the call belongs to."""
        if self.visual is not None:  # the deprecated constructor positions
            return self.visual, self.prompt_len, self.prior
        context = needs(call_context, self.name)
        return context.visual, context.prompt_len, self.prior_for(context)

    def prior_for(self, context: AttentionContext) -> torch.Tensor | None:
        """Return the prior over the context's visual tokens (a function of the context: once per prompt)."""
        if not callable(self.prior):
            return None if self.prior is None else self._checked(self.prior, context.visual)

        def make() -> torch.Tensor | None:
            values = self.prior(context)
            return None if values is None else self._checked(values, context.visual)

        return context.derived(self, make)

    def current_rows(self, call: AttentionCall, prompt_len: int | None = None) -> torch.Tensor:
        """Return the absolute query positions this call holds at or after the last prompt position."""
        if prompt_len is None:
            prompt_len = self.prompt(call.context)[1]
        first = max(call.q_offset, prompt_len - 1)
        return torch.arange(first, call.q_offset + call.query.shape[2], device=call.query.device)

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Overwrite the chosen heads' outputs at the current rows with the prior-weighted values."""
        visual, prompt_len, prior = self.prompt(call.context)
        rows = self.current_rows(call, prompt_len)
        if not len(rows):
            return output
        if call.query.shape[0] != 1:
            raise ValueError("SAP applies to one sample at a time (batch size 1)")
        visual = visual.to(call.key.device)
        scores = row_scores(call, rows)
        new = rebuild_rows(scores, visual, prior, self.convention)
        before_mass = torch.softmax(scores, dim=-1)[..., visual].sum(-1)  # (b, heads, rows)
        b, heads, n_rows, kv_len = new.shape
        kv_heads = call.value.shape[1]
        grouped = new.view(b, kv_heads, heads // kv_heads, n_rows, kv_len)
        values = torch.einsum("bkgrn,bknd->bkgrd", grouped, call.value.float())
        values = values.reshape(b, heads, n_rows, -1).transpose(1, 2)  # (b, rows, heads, dim)
        output = output.clone()
        local = rows - call.q_offset
        for r in range(n_rows):
            chosen = self.heads.select(before_mass[0, :, r])
            output[:, local[r], chosen] = values[:, r, chosen].to(output.dtype)
            if self.record:
                self.records.append(
                    (call.layer, torch.softmax(scores[0, :, r], -1).cpu(), new[0, :, r].cpu(), chosen.cpu())
                )
        return output
