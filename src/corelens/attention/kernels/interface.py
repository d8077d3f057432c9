"""The hybrid kernels' one call shape and their registry: a kernel is a function of one `Prefill`.

A kernel is written once as `fn(call: Prefill, **options)` and registered by name with `@kernel("name")`;
the decorator makes it callable as `(query, key, value, mask, full, pattern, scale, **options)` (the shape
`prefill` and the tests call) and adds it to `KernelInterface`, where `prefill` finds it. docs/extending/kernel.md
is the template of a new one.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch

from corelens.attention.kernels.masks import Pattern
from corelens.registry import Registry


class Prefill(NamedTuple):
    """One whole-prompt prefill call (query i at key position i) of a layer's hybrid attention.

    Post-RoPE queries (batch, heads, n, dim); un-repeated GQA keys / values (batch, kv_heads, n, dim); the
    model's mask ((batch, 1, n, n) booleans, or None for plain causal); `full`, a (heads,) boolean tensor;
    the `Pattern` (S sinks, W window); the softmax scale.
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    full: torch.Tensor
    pattern: Pattern
    scale: float


class KernelInterface(Registry):
    """kernel name -> kernel (`reference`, `blocked`, `flex`, `partitioned`); `auto` is resolved by `choose`."""

    kind = "hybrid kernel"


def kernel(name: str) -> Callable[[Callable], Callable]:
    """Register `fn(call: Prefill, **options) -> (batch, n, heads, dim)` as kernel `name`; return the callable.

    The returned function takes the call's seven fields positionally and `fn`'s keyword options;
    `takes_plans` says whether it takes the caller's `plans` (the mask's padding memo of one forward).
    """

    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(query, key, value, mask, full, pattern, scale, /, **options) -> torch.Tensor:
            return fn(Prefill(query, key, value, mask, full, pattern, scale), **options)

        run.takes_plans = "plans" in inspect.signature(fn).parameters
        return KernelInterface.register(name)(run)

    return register
