"""`mean`: each chosen head's output is replaced by its mean over a reference set (`HeadMeans`), per position
role: visual positions (from the call's context) take the visual mean, the rest (generated tokens too) the
text mean."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from corelens.attention.dispatch import AttentionCall
from corelens.attention.interventions import HeadMeans
from corelens.attention.prompt_context import needs
from corelens.errors import CorelensError
from corelens.policies.core import Policy, model_shape, register
from corelens.policies.heads import HeadsHook, HeadsPolicy


class MeanHook(HeadsHook):
    """Overwrites the chosen heads' outputs with the reference means of each position's role."""

    kind = "output"
    name = "mean ablation"

    def __init__(self, by_layer, means: HeadMeans) -> None:
        super().__init__(by_layer)
        self.means = means
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _values(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (layer, like.device, like.dtype)
        if key not in self._cache:
            heads = self.by_layer[layer].numpy()
            text = torch.from_numpy(self.means.text[layer, heads]).to(like.device, like.dtype)
            visual = torch.from_numpy(self.means.visual[layer, heads]).to(like.device, like.dtype)
            self._cache[key] = (text, visual)
        return self._cache[key]

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Return the output with the chosen heads set to their role's mean."""
        context = needs(call.context, self.name)
        text, visual = self._values(call.layer, output)
        start = call.q_offset
        is_visual = context.visual_mask(start, start + output.shape[1], output.shape[0], output.device)
        if self.means.n_visual == 0 and bool(is_visual.any()):
            raise CorelensError("op 'mean': the reference set had no visual tokens, this input has some")
        value = torch.where(is_visual[:, :, None, None], visual, text)  # (batch, q_len, n, dim)
        return output.index_copy(2, self.index(call.layer, output.device), value.to(output.dtype))


@register
@dataclass(frozen=True)
class MeanHeads(HeadsPolicy):
    """Mean ablation of `heads` with reference statistics `means` (a HeadMeans or a means.npz path)."""

    name: ClassVar[str] = "mean"
    means: Any = field(default=None, compare=False)

    def statistics(self, model: Any) -> HeadMeans:
        """Return the reference statistics, checked against the model's shape."""
        if self.means is None:
            raise CorelensError("op 'mean' needs reference statistics (HeadMeans or a means.npz path)")
        means = self.means if isinstance(self.means, HeadMeans) else HeadMeans.load(self.means)
        expected = model_shape(model)
        if means.text.shape[:2] != expected:
            raise CorelensError(
                f"mean statistics are for {means.text.shape[:2]} (layers, heads), the model has {expected}"
            )
        return means

    def hooks(self, model, context) -> list[MeanHook]:
        """Return the hook on the layers holding `heads`."""
        by_layer = self.by_layer(model)
        return [MeanHook(by_layer, self.statistics(model))]

    def to_dict(self) -> dict:
        """Return the policy as JSON-ready data; statistics held in memory are not data (`means`: null)."""
        means = str(self.means) if isinstance(self.means, (str, Path)) else None
        return Policy.to_dict(replace(self, means=means))
