"""Causal interventions on attention heads (docs/methods.md#interventions): `zero`, `mean`, `uniform` and `knockout`.

An `Ablation` is plain data (heads, operator, key set) that serialises to JSON. `ablate(m, ...)` activates it on
a loaded model for the duration of a block, through the corelens attention function, in the prefill and at
every decoding step with a KV cache:

- `zero`: the head's output (its slice of the `o_proj` input) is set to 0;
- `mean`: the head's output is replaced by its mean over a reference set (`HeadMeans`), per position role
  (visual / text; decoding tokens are text);
- `uniform`: the head's query is zeroed, so its softmax is uniform over the keys its mask allows;
- `knockout`: the head's scores on a key set (all visual tokens, or Omega) are masked before the softmax and
  the rest renormalises. A query row left with no key at all outputs 0 for that head **[decision]**.

Positions and roles. `mean` and `knockout` must know which absolute positions of the running sequence are
visual (and, for knockout of Omega, which are in Omega). By default roles come from the token ids: a forward
pre-hook on the input embedding sees the ids of every forward (the whole prompt in the prefill, the new token
when decoding), and positions holding the config's `image_token_id` / `video_token_id` are visual; positions
appended later (generated tokens) are text. `Ablator.positions(visual=..., omega=...)` overrides this with
absolute positions for the forwards inside its block (`Ablator.for_sample` takes them from `prepare(...)`'s
layout, the same sets RAM uses); Omega can only be given that way. Forwards from `inputs_embeds` carry no ids:
give their positions explicitly. Absolute key positions assume a cache that keeps every key (DynamicCache).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from corelens.attention.dispatch import AttentionCall, AttentionHook, Kernel, activate
from corelens.choices import KEY_SETS, OPS
from corelens.errors import CorelensError, OptionError

if TYPE_CHECKING:
    from corelens.data.sample import Sample
    from corelens.models.loaded import Loaded
    from corelens.models.prepare import Prepared

# Bound on the (batch, heads, rows, keys) mask / score block the knockout reference materialises at once.
_CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class Ablation:
    """An ablation policy as plain data: which (layer, query head) pairs, which operator, which key set.

    Examples:
        >>> a = Ablation([(0, 6), (0, 5), (0, 5)], op="knockout", keys="omega", label="top/2")
        >>> a.heads  # sorted, duplicates dropped
        ((0, 5), (0, 6))
        >>> a.to_json()
        '{"heads": [[0, 5], [0, 6]], "keys": "omega", "label": "top/2", "meta": {}, "op": "knockout", "seed": null}'
        >>> Ablation.from_json(a.to_json()) == a
        True
    """

    heads: tuple[tuple[int, int], ...]
    op: str = "zero"
    keys: str = "visual"  # knockout only: "visual" (every visual token) or "omega" (the sample's target set)
    label: str = ""  # free text, e.g. "top/5%"
    seed: int | None = None  # the seed that drew `heads`, when they were drawn at random
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise so equal policies compare (and hash their JSON) equal, whatever the input container.
        object.__setattr__(self, "heads", tuple(sorted({(int(lh[0]), int(lh[1])) for lh in self.heads})))
        if self.op not in OPS:
            raise OptionError(f"unknown ablation op {self.op!r}; expected one of {OPS}")
        if self.keys not in KEY_SETS:
            raise OptionError(f"unknown knockout key set {self.keys!r}; expected one of {KEY_SETS}")

    def to_dict(self) -> dict:
        """Return the policy as a JSON-ready dict."""
        data = asdict(self)
        data["heads"] = [list(h) for h in self.heads]
        return data

    def to_json(self) -> str:
        """Return the policy as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> Ablation:
        """Return the policy described by a dict from `to_dict`."""
        return cls(**{**data, "heads": tuple(tuple(h) for h in data["heads"])})

    @classmethod
    def from_json(cls, text: str) -> Ablation:
        """Return the policy described by a JSON string from `to_json`."""
        return cls.from_dict(json.loads(text))


@dataclass
class HeadMeans:
    """Mean output of every (layer, query head) over a reference set, per role: (layers, heads, head_dim)."""

    text: np.ndarray
    visual: np.ndarray
    n_text: int  # positions averaged (per layer and head)
    n_visual: int
    meta: dict = field(default_factory=dict)  # where the statistics come from (file, sha256, sample ids)

    def save(self, path: str | Path) -> Path:
        """Write the statistics to an `.npz` file (arrays + JSON metadata); return the path."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            text=self.text,
            visual=self.visual,
            n_text=self.n_text,
            n_visual=self.n_visual,
            meta=json.dumps(self.meta, sort_keys=True),
        )
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> HeadMeans:
        """Read statistics written by `save`."""
        with np.load(path) as f:
            return cls(
                f["text"], f["visual"], int(f["n_text"]), int(f["n_visual"]), json.loads(str(f["meta"]))
            )


class Roles:
    """Which absolute positions of the running sequences are visual / in Omega (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = model.config
        ids = [getattr(config, name, None) for name in ("image_token_id", "video_token_id")]
        self._token_ids = torch.tensor([i for i in ids if i is not None], dtype=torch.long)
        self._embedding = model.get_input_embeddings()
        self._pending: torch.Tensor | None = None
        self._visual: torch.Tensor | None = None  # (batch, positions seen) bool; None = unknown
        self.explicit_visual: torch.Tensor | None = None  # absolute positions, shared by the batch
        self.omega: torch.Tensor | None = None

    @contextmanager
    def watching(self) -> Iterator[Roles]:
        """Watch the token ids of every forward for the duration of the block."""
        handle = self._embedding.register_forward_pre_hook(self._on_ids)
        try:
            yield self
        finally:
            handle.remove()

    def _on_ids(self, module: torch.nn.Module, args: tuple) -> None:
        ids = args[0] if args else None
        # The placeholder lookups Qwen-VL makes without ids are 0-d; only a (batch, len) call is a forward.
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            self._pending = torch.isin(ids, self._token_ids.to(ids.device))

    def sync(self, call: AttentionCall) -> None:
        """Take in the ids of the current forward; call once per forward (at one layer)."""
        pending, self._pending = self._pending, None
        start, batch, q_len = call.q_offset, call.query.shape[0], call.query.shape[2]
        if start == 0:
            self._visual = pending if pending is not None and pending.shape[1] == q_len else None
            return
        if self._visual is None:
            return
        if pending is None or pending.shape[1] != q_len:
            pending = torch.zeros(batch, q_len, dtype=torch.bool, device=self._visual.device)
        known = self._visual[:, :start]
        if known.shape[1] < start:
            gap = torch.zeros(batch, start - known.shape[1], dtype=torch.bool, device=known.device)
            known = torch.cat([known, gap], dim=1)
        self._visual = torch.cat([known, pending.to(known.device)], dim=1)

    def _mask(self, positions: torch.Tensor, length: int, batch: int, device: torch.device) -> torch.Tensor:
        mask = torch.zeros(length, dtype=torch.bool, device=device)
        inside = positions[(positions >= 0) & (positions < length)]
        mask[inside.to(device)] = True
        return mask.expand(batch, length)

    def visual_mask(self, call: AttentionCall, start: int, stop: int) -> torch.Tensor:
        """Return (batch, stop - start) bool: which absolute positions in [start, stop) are visual."""
        batch, device = call.query.shape[0], call.query.device
        if self.explicit_visual is not None:
            return self._mask(self.explicit_visual, stop, batch, device)[:, start:]
        if self._visual is None:
            raise CorelensError(
                "this ablation needs the visual positions, but the forward carried no token ids "
                "(inputs_embeds?): set them with `ablator.positions(visual=...)`"
            )
        part = self._visual[:, start:stop].to(device)
        if part.shape[1] < stop - start:
            pad = torch.zeros(batch, stop - start - part.shape[1], dtype=torch.bool, device=device)
            part = torch.cat([part, pad], dim=1)
        return part

    def omega_mask(self, call: AttentionCall, length: int) -> torch.Tensor:
        """Return (batch, length) bool: which key positions are in Omega."""
        if self.omega is None:
            raise CorelensError(
                "knockout of 'omega' needs the sample's Omega: use `with ablator.positions(omega=...)` "
                "(or `ablator.for_sample(sample, prepared)`)"
            )
        return self._mask(self.omega, length, call.query.shape[0], call.query.device)


def _as_positions(values: Sequence[int] | np.ndarray | torch.Tensor | None) -> torch.Tensor | None:
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.long).reshape(-1)
    return torch.as_tensor(np.asarray(values, dtype=np.int64).reshape(-1))


def knockout_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    blocked: torch.Tensor,
    q_offset: int,
) -> torch.Tensor:
    """Return attention (batch, heads, q_len, dim) of query heads whose KV heads are given, keys `blocked` masked.

    `key` / `value` are already one KV head per query head; `blocked` is (batch, kv_len) bool. The causal or
    padding mask of the call applies as the model passes it (None = causal, bottom-right aligned). Rows are
    processed in chunks so the dense mask never exceeds `_CHUNK_ELEMENTS`.
    """
    batch, heads, q_len, _ = query.shape
    kv_len = key.shape[2]
    out = torch.empty(batch, heads, q_len, value.shape[-1], dtype=query.dtype, device=query.device)
    step = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * kv_len))
    keys = torch.arange(kv_len, device=query.device)
    free = ~blocked[:, None, None, :].to(query.device)
    # fp32 scores and softmax whatever the model's dtype: sdpa's math fallback would run them in bf16.
    key32, value32 = key.float(), value.float()
    for s in range(0, q_len, step):
        e = min(q_len, s + step)
        if attention_mask is None:
            rows = torch.arange(s, e, device=query.device) + q_offset
            allowed = (keys[None, :] <= rows[:, None])[None, None] & free
        else:
            block = attention_mask[:, :, s:e, :kv_len]
            if block.dtype == torch.bool:
                allowed = block & free
            else:
                allowed = (block > torch.finfo(block.dtype).min / 2) & free
        allowed = allowed.expand(batch, heads, e - s, kv_len)
        alive = allowed.any(dim=-1, keepdim=True)
        # A row with no key left would be NaN: let it see key 0, then zero its output.
        safe = allowed | (~alive & (keys == 0))
        part = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, s:e].float(), key32, value32, attn_mask=safe, scale=scaling
        ).to(query.dtype)
        out[:, :, s:e] = torch.where(alive, part, torch.zeros((), dtype=part.dtype, device=part.device))
    return out


def _knockout_kernel(inner: Kernel, heads: torch.Tensor, blocked: torch.Tensor, q_offset: int) -> Kernel:
    """Return a kernel that runs `inner` for all heads, then recomputes `heads` with `blocked` keys masked."""

    def kernel(module, query, key, value, attention_mask, *, scaling, dropout=0.0, **kwargs):
        output, weights = inner(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
        groups = query.shape[1] // key.shape[1]
        idx = heads.to(query.device)
        kv_idx = idx // groups
        part = knockout_attention(
            query[:, idx], key[:, kv_idx], value[:, kv_idx], attention_mask, scaling, blocked, q_offset
        )
        output = output.index_copy(2, idx, part.transpose(1, 2).to(output.dtype))
        return output, weights

    return kernel


class Ablator(AttentionHook):
    """The attention hook that applies one `Ablation` (activate it with `ablate`)."""

    @property
    def kind(self) -> str:
        """Return what the operator changes: the queries, the output, or (knockout) the attention pattern."""
        return {"uniform": "query", "knockout": "pattern"}.get(self.ablation.op, "output")

    @property
    def name(self) -> str:
        """Return "<op> ablation"."""
        return f"{self.ablation.op} ablation"

    def __init__(self, m: Loaded, ablation: Ablation, means: HeadMeans | str | Path | None = None) -> None:
        self.ablation = ablation
        layers, heads = m.num_layers, m.num_heads
        for layer, head in ablation.heads:
            if not (0 <= layer < layers and 0 <= head < heads):
                raise CorelensError(
                    f"head (layer {layer}, head {head}) is outside the model ({layers} layers x {heads} heads)"
                )
        by_layer: dict[int, list[int]] = {}
        for layer, head in ablation.heads:
            by_layer.setdefault(layer, []).append(head)
        self.by_layer = {layer: torch.tensor(hs, dtype=torch.long) for layer, hs in by_layer.items()}
        self._first = min(self.by_layer) if self.by_layer else -1
        self._modules = [(layer, mod) for layer, mod in m.layer_modules() if layer in self.by_layer]
        self.roles = Roles(m.model) if ablation.op in ("mean", "knockout") else None
        self.means: HeadMeans | None = None
        self._mean_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        if ablation.op == "mean":
            if means is None:
                raise CorelensError("op 'mean' needs reference statistics (HeadMeans or a means.npz path)")
            self.means = means if isinstance(means, HeadMeans) else HeadMeans.load(means)
            expected = (layers, heads)
            if self.means.text.shape[:2] != expected:
                raise CorelensError(
                    f"mean statistics are for {self.means.text.shape[:2]} (layers, heads), the model has {expected}"
                )

    @contextmanager
    def installed(self) -> Iterator[Ablator]:
        """Activate the hook on the layers that hold ablated heads (and watch token ids if roles are needed)."""
        with activate(self._modules, self):
            if self.roles is None:
                yield self
            else:
                with self.roles.watching():
                    yield self

    @contextmanager
    def positions(
        self,
        *,
        visual: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        omega: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    ) -> Iterator[Ablator]:
        """Use these absolute visual / Omega positions (shared by the batch) for the forwards in the block."""
        if self.roles is None:
            yield self
            return
        old = self.roles.explicit_visual, self.roles.omega
        if visual is not None:
            self.roles.explicit_visual = _as_positions(visual)
        if omega is not None:
            self.roles.omega = _as_positions(omega)
        try:
            yield self
        finally:
            self.roles.explicit_visual, self.roles.omega = old

    def for_sample(self, sample: Sample, prepared: Prepared, rule: str = "any") -> AbstractContextManager:
        """Return `positions(...)` set from a prepared sample's layout (Omega only when the policy needs it)."""
        if self.roles is None:
            return self.positions()
        omega = None
        if self.ablation.op == "knockout" and self.ablation.keys == "omega":
            omega = prepared.layout.omega(sample.targets, rule, sample=sample.id)
        return self.positions(visual=prepared.layout.visual, omega=omega)

    def pre(self, call: AttentionCall) -> None:
        """Sync roles once per forward; zero the queries (`uniform`)."""
        if self.roles is not None and call.layer == self._first:
            self.roles.sync(call)
        if self.ablation.op == "uniform":
            idx = self.by_layer[call.layer].to(call.query.device)
            call.query = call.query.index_fill(1, idx, 0.0)

    def attend(self, call: AttentionCall, inner: Kernel) -> Kernel:
        """Knockout: wrap `inner` so that the ablated heads are recomputed without the blocked keys."""
        if self.ablation.op != "knockout":
            return inner
        kv_len = call.key.shape[2]
        if self.ablation.keys == "visual":
            blocked = self.roles.visual_mask(call, 0, kv_len)
        else:
            blocked = self.roles.omega_mask(call, kv_len)
        if not bool(blocked.any()):  # an empty key set leaves the call untouched
            return inner
        return _knockout_kernel(inner, self.by_layer[call.layer], blocked, call.q_offset)

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Zero (`zero`) or overwrite with reference means (`mean`) the ablated heads' outputs."""
        op = self.ablation.op
        idx = self.by_layer[call.layer].to(output.device)
        if op == "zero":
            return output.index_fill(2, idx, 0.0)
        if op == "mean":
            text, visual = self._means(call.layer, output)
            start = call.q_offset
            is_visual = self.roles.visual_mask(call, start, start + output.shape[1])  # (batch, q_len)
            if self.means.n_visual == 0 and bool(is_visual.any()):
                raise CorelensError("op 'mean': the reference set had no visual tokens, this input has some")
            value = torch.where(is_visual[:, :, None, None], visual, text)  # (batch, q_len, n, dim)
            return output.index_copy(2, idx, value.to(output.dtype))
        return output

    def _means(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (layer, like.device, like.dtype)
        if key not in self._mean_cache:
            heads = self.by_layer[layer].numpy()
            text = torch.from_numpy(self.means.text[layer, heads]).to(like.device, like.dtype)
            visual = torch.from_numpy(self.means.visual[layer, heads]).to(like.device, like.dtype)
            self._mean_cache[key] = (text, visual)
        return self._mean_cache[key]


@contextmanager
def ablate(
    m: Loaded,
    heads: Ablation | Iterable[tuple[int, int]],
    op: str = "zero",
    *,
    keys: str = "visual",
    means: HeadMeans | str | Path | None = None,
) -> Iterator[Ablator]:
    """Ablate (layer, query head) pairs of `m` inside the block (prefill and decoding); yield the `Ablator`.

    `heads` is an `Ablation` (then `op` / `keys` are taken from it) or an iterable of (layer, head) pairs.
    `means` (op `mean`): reference statistics from `corelens.experiments.ablate.reference_means`.

    Examples:
        >>> import corelens as cl
        >>> from corelens.organism import organism_path
        >>> from corelens.organism.tasks import generate
        >>> m = cl.load(organism_path(), device="cpu")
        >>> samples, _ = cl.read_samples(generate("image", getfixture("tmp_path"), 1, seed=1))
        >>> inputs = cl.prepare(m, samples[0]).inputs
        >>> def answer(**kw):  # two greedy tokens
        ...     out = m.model.generate(**inputs, max_new_tokens=2, do_sample=False, **kw)
        ...     return m.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
        >>> answer()
        'green cross'
        >>> with cl.ablate(m, [(0, 5), (0, 6), (0, 7)]):  # the organism's top 3 heads (`cl.rank`), zeroed
        ...     answer()
        'green ring'
        >>> with cl.ablate(m, [(1, 1), (2, 2), (3, 3)]):  # three other heads
        ...     answer()
        'green cross'
        >>> with cl.ablate(m, cl.Ablation(((0, 5), (0, 6), (0, 7)), op="knockout")):  # visual keys masked
        ...     answer()
        'green square'
    """
    ablation = heads if isinstance(heads, Ablation) else Ablation(tuple(heads), op, keys)
    with Ablator(m, ablation, means).installed() as hook:
        yield hook


class MeanRecorder(AttentionHook):
    """Accumulates each (layer, query head)'s output over positions, split by role (visual / text), in fp64."""

    name = "mean recorder"

    def __init__(self, m: Loaded) -> None:
        shape = (
            m.num_layers,
            m.num_heads,
            m.text_config.head_dim or m.text_config.hidden_size // m.num_heads,
        )
        self.text = torch.zeros(shape, dtype=torch.float64)
        self.visual = torch.zeros(shape, dtype=torch.float64)
        self.n_text = 0
        self.n_visual = 0
        self.roles = Roles(m.model)
        self._modules = m.layer_modules()

    @contextmanager
    def installed(self) -> Iterator[MeanRecorder]:
        """Activate the recorder on every decoder layer."""
        with activate(self._modules, self), self.roles.watching():
            yield self

    def pre(self, call: AttentionCall) -> None:
        """Sync roles at the first layer."""
        if call.layer == 0:
            self.roles.sync(call)

    def post(self, call: AttentionCall, output: torch.Tensor) -> torch.Tensor:
        """Add this call's outputs to the per-role sums."""
        start = call.q_offset
        is_visual = self.roles.visual_mask(call, start, start + output.shape[1])
        out = output.detach().double()
        self.visual[call.layer] += out[is_visual].sum(dim=0).cpu()
        self.text[call.layer] += out[~is_visual].sum(dim=0).cpu()
        if call.layer == 0:
            self.n_visual += int(is_visual.sum())
            self.n_text += int((~is_visual).sum())
        return output

    def result(self, meta: dict | None = None) -> HeadMeans:
        """Return the means (NaN for a role never seen)."""
        nan = float("nan")
        text = (self.text / self.n_text).numpy() if self.n_text else np.full(self.text.shape, nan)
        visual = (self.visual / self.n_visual).numpy() if self.n_visual else np.full(self.visual.shape, nan)
        return HeadMeans(text, visual, self.n_text, self.n_visual, dict(meta or {}))
