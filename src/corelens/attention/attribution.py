"""Attribution patching: one gate per head on its output, for the gradient estimate of single-head effects.

docs/importance.md#attribution. `HeadGate` is an "output" hook (`attention.dispatch`) on every decoder layer.
With gates s (layers x heads, zero by default) each head's output o_h becomes

    o_h + s_h (a_h - o_h)

where a_h is what the intervention would put there: 0 for `zero`, and for `knockout` the head's output
recomputed with the blocked keys masked (`interventions.knockout_attention`, the operator `ablate` uses).
At s = 0 the model is unchanged; s_h = 1 is the single-head intervention on head h (upstream of its layer
exactly, downstream through the changed residual stream); the gradient of a scalar f (the answer's log p)
with respect to s_h at s = 0 is sum over positions of grad_{o_h} f . (a_h - o_h), the first-order estimate
of f(s_h = 1) - f(s = 0): for zeroing -(grad . head output). One forward and one backward give it for every
head at once. Gates per copy of a batch (`batch`) give, say, every single-head intervention in one forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch

from corelens.attention.dispatch import AttentionCall, AttentionHook, activate
from corelens.attention.interventions import knockout_attention
from corelens.attention.prompt_context import needs
from corelens.choices import KEY_SETS
from corelens.errors import OptionError

if TYPE_CHECKING:
    from corelens.models.loaded import Loaded

GATED_OPS = ("zero", "knockout")


class HeadGate(AttentionHook):
    """Gates s (layers, heads) that move each head's output towards its intervened value (module docstring).

    A knockout built without `blocked` blocks the call's context's `keys` ("visual" or "omega": the prompt's
    V or Omega, `attention_context(AttentionContext.of(prepared, omega=...))`), so one gate serves any prompt.
    """

    kind = "output"
    name = "head gate"

    def __init__(
        self,
        m: Loaded,
        op: str = "zero",
        blocked: Sequence[int] | np.ndarray | None = None,
        batch: int | None = None,
        keys: str = "visual",
    ) -> None:
        if op not in GATED_OPS:
            raise OptionError(f"attribution supports the operators {GATED_OPS}, not {op!r}")
        if op == "knockout" and blocked is None and keys not in KEY_SETS:
            raise OptionError(f"knockout attribution blocks the keys {KEY_SETS}, not {keys!r}")
        self.op = op
        self.keys = keys
        self.blocked = None if blocked is None else torch.as_tensor(np.asarray(blocked, dtype=np.int64))
        # (layers, heads) shared by a batch; `batch` gives each copy its own gates (batch, layers, heads).
        shape = (m.num_layers, m.num_heads) if batch is None else (batch, m.num_layers, m.num_heads)
        self.gates = torch.zeros(shape, dtype=torch.float32)
        self._modules = m.layer_modules()

    @contextmanager
    def installed(self) -> Iterator[HeadGate]:
        """Activate the gates on every decoder layer for the duration of the block."""
        with activate(self._modules, self):
            yield self

    def _blocked(self, call: AttentionCall) -> torch.Tensor:
        """Return the blocked key positions: the constructor's, or the `keys` of the call's prompt."""
        if self.blocked is not None:
            return self.blocked
        context = needs(call.context, self.name)
        return context.omega if self.keys == "omega" else context.visual

    def _target(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Return a: what the intervention puts in each head's output (batch, q_len, heads, dim)."""
        if self.op == "zero":
            return torch.zeros_like(output)
        kv_len = call.key.shape[2]
        positions = self._blocked(call)
        blocked = torch.zeros(call.query.shape[0], kv_len, dtype=torch.bool, device=call.query.device)
        inside = positions[(positions >= 0) & (positions < kv_len)].to(blocked.device)
        blocked[:, inside] = True
        if not bool(blocked.any()):  # no key to block: the knockout leaves the call untouched (as `ablate`)
            return output
        kv = torch.arange(call.query.shape[1], device=call.key.device) // call.groups
        with torch.no_grad():  # a_h enters only through s_h (a_h - o_h): its own gradient is not needed
            part = knockout_attention(
                call.query, call.key[:, kv], call.value[:, kv], call.attention_mask, call.scaling, blocked,
                call.q_offset,
            )  # fmt: skip
        return part.transpose(1, 2).to(output.dtype)

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Return o + s (a - o) per head; the identity (the same tensor) where the layer's gates are all 0 and
        need no gradient."""
        gates = self.gates[..., call.layer, :]  # (heads,) or, per copy of a batch, (batch, heads)
        if not gates.requires_grad and not bool(gates.any()):
            return output  # nothing to move and nothing to differentiate
        s = gates.to(output.device, output.dtype)
        s = s[None, None, :, None] if s.dim() == 1 else s[:, None, :, None]
        return output + s * (self._target(call, output) - output)
