"""What the prepared prompt knows about its positions, handed to every hook through `AttentionCall.context`.

`prepare()` already found where the visual tokens sit, which rows are the question's and how long the prompt
is; a hook reads that here instead of re-deriving it from token ids. Positions are absolute and shared by
the batch; a position at or after `prompt_len` (a generated token) is text and never in Omega, so decoding
steps read the same sets as the prefill. `attention_context(ctx)` makes `ctx` the context of every attention
call inside the block (in this thread); outside any block `call.context` is None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cached_property
from typing import Any

import numpy as np
import torch

from corelens.errors import CorelensError


def _positions(values: Any) -> torch.Tensor:
    """Return absolute positions as a flat CPU long tensor."""
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.long).reshape(-1)
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1))


class AttentionContext:
    """Visual and Omega positions, query rows, prompt length (and the layout) of the prompt being run.

    `omega` may be given as positions or as a function that returns them: Omega is then computed (and its
    errors raised) only when a hook reads it.
    """

    def __init__(
        self,
        visual: Any = (),
        *,
        omega: Any = None,
        query_rows: Any = None,
        prompt_len: int | None = None,
        layout: Any = None,
        prepared: Any = None,
        sample: Any = None,
    ) -> None:
        self.visual = _positions(visual)
        self._omega = omega
        self.query_rows = None if query_rows is None else _positions(query_rows)
        self.prompt_len = prompt_len
        self.layout = layout
        self.prepared = prepared  # the whole prepared prompt and its sample, for what a policy derives from
        self.sample = sample  # them once per prompt (a SAP prior); None when not given
        self._derived: dict[Any, Any] = {}

    @classmethod
    def of(
        cls, prepared: Any, omega: Any = None, sample: Any = None, query_rows: Any = None
    ) -> AttentionContext:
        """Return the context of a `Prepared` prompt (`omega`: positions or a function returning them;
        `query_rows`: the rows a probe reads, when not the question's, e.g. `prepared.rows("answer")`)."""
        return cls(
            prepared.layout.visual,
            omega=omega,
            query_rows=prepared.question_rows if query_rows is None else query_rows,
            prompt_len=prepared.prompt_len,
            layout=prepared.layout,
            prepared=prepared,
            sample=sample,
        )

    @cached_property
    def omega(self) -> torch.Tensor:
        """Return the absolute Omega positions (computed on first use when given as a function)."""
        if self._omega is None:
            raise CorelensError(
                "this policy needs the sample's Omega: apply it with the sample "
                "(`policy.applied(m, prepared, sample=sample)`) or give the context `omega=`"
            )
        return _positions(self._omega() if callable(self._omega) else self._omega)

    def derived(self, key: Any, make: Callable[[], Any]) -> Any:
        """Return `make()` for this prompt, computed on the first call for `key` and kept with the context.

        What a hook derives from the prompt (a SAP prior) is thus computed once per prompt, however many
        layers and decoding steps read it, and one hook serves every prompt.
        """
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    @staticmethod
    def _mask(positions: torch.Tensor, length: int, batch: int, device: torch.device) -> torch.Tensor:
        mask = torch.zeros(length, dtype=torch.bool, device=device)
        inside = positions[(positions >= 0) & (positions < length)]
        mask[inside.to(device)] = True
        return mask.expand(batch, length)

    def visual_mask(self, start: int, stop: int, batch: int, device: torch.device) -> torch.Tensor:
        """Return (batch, stop - start) bool: which absolute positions in [start, stop) are visual."""
        return self._mask(self.visual, stop, batch, device)[:, start:]

    def omega_mask(self, length: int, batch: int, device: torch.device) -> torch.Tensor:
        """Return (batch, length) bool: which key positions are in Omega."""
        return self._mask(self.omega, length, batch, device)


_current: ContextVar[AttentionContext | None] = ContextVar("corelens_attention_context", default=None)


def current_context() -> AttentionContext | None:
    """Return the context of the attention calls running now (None outside `attention_context`)."""
    return _current.get()


@contextmanager
def attention_context(context: AttentionContext | None) -> Iterator[AttentionContext | None]:
    """Make `context` the one every attention call inside the block carries (None: leave it as it is)."""
    if context is None:
        yield _current.get()
        return
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def needs(call_context: AttentionContext | None, who: str) -> AttentionContext:
    """Return the call's context, or say which hook needed one that the forward did not carry."""
    if call_context is None:
        raise CorelensError(
            f"{who} needs the prompt's positions, but the forward carried no context: apply the policy with "
            "the prepared sample (`with policy.applied(m, prepared): ...`)"
        )
    return call_context


__all__ = ["AttentionContext", "attention_context", "current_context", "needs"]
