"""What a forward of a loaded model is read for: residual states (here), attention maps (`attention_maps`,
below) and the annotation-free Omega (`corelens.capture.omega`).

Residual-stream capture: the input and output states of every decoder attention and FFN module, streamed.

Torch forward hooks on each decoder layer and on its `self_attn` (no forward is patched). For a Qwen-VL
decoder layer (pre-norm: `h = x + self_attn(norm(x)); out = h + mlp(norm(h))`):

    attention: X = layer input,            X' = X + self_attn(...)   (the residual after the attention add)
    FFN:       X = that post-attention sum, X' = layer output

The post-attention sum is recomputed from the layer input and the attention module's output in the model's
own dtype, the same operation the layer performs, so it is bit-identical to the tensor the layer holds.
Each layer's states (selected positions only, cast to fp32) are handed to a callback as soon as the layer
has run and then dropped: one layer of one prompt is in memory at a time, never the whole stack.

Optional, in the same forward:
- `attn_delta(layer, delta) -> delta`: replaces the attention update ΔX_attn (the noise-Δ baseline); the
  stream propagates with the replacement;
- every layer also hands over its attention output ΔX_attn itself (`delta`), not only X + ΔX_attn;
- `norope=True`: the attention output recomputed with rotary position encoding disabled (identity rotation),
  from the pre-RoPE queries and keys read at the q/k projections (after q_norm / k_norm where the family has
  them), with the same values, mask, kernel and `o_proj` (for ε_RoPE, docs/methods.md#geometry).

`attention_maps` captures what the report draws over the pictures: chosen heads' attention over every key of
one prompt (the overlays and the head explorer; `corelens.report` draws, it does not run the model).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from corelens.attention.dispatch import AttentionCall, AttentionHook, activate
from corelens.attention.probes import KeyMapProbe
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.data.sample import Sample
from corelens.errors import OptionError, UnsupportedModelError
from corelens.models.loaded import Loaded
from corelens.models.prepare import Prepared, prepare


@dataclass
class LayerStates:
    """The residual states of one decoder layer at the captured positions: (positions, hidden), fp32."""

    layer: int
    x_in: torch.Tensor  # layer input = attention input
    x_mid: torch.Tensor  # after the attention add = FFN input
    x_out: torch.Tensor  # layer output = FFN output
    delta: torch.Tensor | None = None  # the attention output ΔX_attn added to x_in (after `attn_delta`)
    delta_norope: torch.Tensor | None = None  # the attention output recomputed without RoPE (norope=True)
    x_mid_norope: torch.Tensor | None = None  # x_in + delta_norope (norope=True)

    def module(self, name: str, reference: str = "module") -> tuple[torch.Tensor, torch.Tensor]:
        """Return (X, X') of 'attn' or 'ffn'; reference 'layer' compares the FFN output to the layer input."""
        if name == "attn":
            return self.x_in, self.x_mid
        if name == "ffn":
            return (self.x_in if reference == "layer" else self.x_mid), self.x_out
        raise OptionError(f"unknown module {name!r}; expected 'attn' or 'ffn'")


def decoder_layers(m: Loaded) -> list[torch.nn.Module]:
    """Return the decoder layers in order: the modules holding each decoder attention module as `self_attn`."""
    wanted = {id(a): i for i, a in enumerate(m.attention_layers)}
    found: dict[int, torch.nn.Module] = {}
    for module in m.model.modules():
        attn = getattr(module, "self_attn", None)
        if attn is not None and id(attn) in wanted and hasattr(module, "mlp"):
            found[wanted[id(attn)]] = module
    if sorted(found) != list(range(m.num_layers)):
        raise UnsupportedModelError(f"could not find the decoder layers of {type(m.model).__name__}")
    return [found[i] for i in range(m.num_layers)]


def _first(output):
    return output[0] if isinstance(output, tuple | list) else output


def _hidden_from(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


class _NoRope(AttentionHook):
    """Recomputes each layer's attention output from pre-RoPE queries/keys; stores it after `o_proj`."""

    reads = "scores"
    name = "RoPE-free capture"

    def __init__(self) -> None:
        self.pre_q: dict[int, torch.Tensor] = {}
        self.pre_k: dict[int, torch.Tensor] = {}
        self.output: dict[int, torch.Tensor] = {}

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Leave the output alone; compute the rotation-free twin of this call."""
        key = id(call.module)
        q, k = self.pre_q.pop(key), self.pre_k.pop(key)
        if k.shape[2] != call.key.shape[2]:
            raise ValueError("the RoPE-free attention needs a forward without a KV cache (use_cache=False)")
        plain, _ = sdpa_attention_forward(
            call.module,
            q,
            k,
            call.value,
            call.attention_mask,
            scaling=call.scaling,
            dropout=0.0,
            **call.kwargs,
        )
        b, n = plain.shape[:2]
        self.output[call.layer] = call.module.o_proj(plain.reshape(b, n, -1))
        return output


def _heads_first(states: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(batch, tokens, heads·dim) or (batch, tokens, heads, dim) -> (batch, heads, tokens, dim)."""
    if states.dim() == 3:
        states = states.view(*states.shape[:2], -1, head_dim)
    return states.transpose(1, 2)


class ResidualCapture:
    """Context manager streaming each decoder layer's residual states to `on_layer` during a forward.

    `positions`: token positions to keep (all when None). Batch size 1.
    """

    def __init__(
        self,
        m: Loaded,
        on_layer: Callable[[LayerStates], None],
        *,
        positions: torch.Tensor | None = None,
        attn_delta: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
        norope: bool = False,
    ) -> None:
        self.m = m
        self.on_layer = on_layer
        self.positions = positions
        self.attn_delta = attn_delta
        self.norope = norope
        self._stack: ExitStack | None = None
        self._x_in: dict[int, torch.Tensor] = {}
        self._x_mid: dict[int, torch.Tensor] = {}
        self._delta: dict[int, torch.Tensor] = {}
        self._norope_hook: _NoRope | None = None

    def _select(self, states: torch.Tensor) -> torch.Tensor:
        if states.shape[0] != 1:
            raise ValueError("residual capture works on one sample at a time (batch size 1)")
        s = states[0]
        if self.positions is not None:
            s = s[self.positions.to(s.device)]
        return s.float()

    def __enter__(self) -> ResidualCapture:
        stack = ExitStack()
        try:
            self._register(stack)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def _register(self, stack: ExitStack) -> None:
        layers = decoder_layers(self.m)
        for i, layer in enumerate(layers):
            stack.callback(layer.register_forward_pre_hook(self._pre(i), with_kwargs=True).remove)
            stack.callback(layer.self_attn.register_forward_hook(self._attn(i)).remove)
            stack.callback(layer.register_forward_hook(self._post(i)).remove)
        if not self.norope:
            return
        self._norope_hook = _NoRope()
        for layer in layers:
            attn = layer.self_attn
            # Qwen3-VL normalises q / k per head before the rotation: read them after that norm.
            q_mod = attn.q_norm if hasattr(attn, "q_norm") else attn.q_proj
            k_mod = attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj
            for module, into in ((q_mod, self._norope_hook.pre_q), (k_mod, self._norope_hook.pre_k)):
                stack.callback(module.register_forward_hook(self._store(into, attn, attn.head_dim)).remove)
        stack.enter_context(activate(self.m.layer_modules(), self._norope_hook))

    def __exit__(self, *exc) -> None:
        self._x_in.clear()
        self._x_mid.clear()
        self._delta.clear()
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @staticmethod
    def _store(into: dict, attn: torch.nn.Module, head_dim: int):
        def hook(module, args, output):
            into[id(attn)] = _heads_first(output, head_dim)

        return hook

    def _pre(self, i: int):
        def hook(module, args, kwargs):
            self._x_in[i] = _hidden_from(args, kwargs)

        return hook

    def _attn(self, i: int):
        def hook(module, args, output):
            delta = _first(output)
            replaced = delta if self.attn_delta is None else self.attn_delta(i, delta)
            self._x_mid[i] = self._x_in[i] + replaced  # the layer's own `residual + hidden_states`
            self._delta[i] = replaced
            if replaced is delta:
                return None
            return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

        return hook

    def _post(self, i: int):
        def hook(module, args, output):
            x_in, x_mid, delta = self._x_in.pop(i), self._x_mid.pop(i), self._delta.pop(i)
            d_norope = x_norope = None
            if self._norope_hook is not None:
                plain = self._norope_hook.output.pop(i)
                d_norope, x_norope = self._select(plain), self._select(x_in + plain)
            self.on_layer(
                LayerStates(
                    i,
                    self._select(x_in),
                    self._select(x_mid),
                    self._select(_first(output)),
                    delta=self._select(delta),
                    delta_norope=d_norope,
                    x_mid_norope=x_norope,
                )
            )

        return hook


def attention_maps(
    m: Loaded,
    sample: Sample,
    heads: list[tuple[int, int]],
    query: str = "question",
    probe: KeyMapProbe | None = None,
) -> tuple[Prepared, dict[tuple[int, int], np.ndarray]]:
    """Return the prepared prompt and, per head, the mean attention of the `query` rows over every key.

    `probe`: a `KeyMapProbe(heads)` built without rows, shared by the samples drawn."""
    prepared = prepare(m, sample, answer=sample.answer if query == "answer" else None)
    probe = probe if probe is not None else KeyMapProbe(heads)
    context = AttentionContext.of(prepared, sample=sample, query_rows=prepared.rows(query))
    with torch.no_grad(), attention_context(context), activate(m.layer_modules(), probe):
        m.model(**prepared.to(m.device), use_cache=False, logits_to_keep=1)
    return prepared, {head: values.double().numpy() for head, values in probe.maps.items()}
