"""A corelens head set as a kvpress press (optional extra: `pip install corelens[kvpress]`).

`CorePress` is kvpress's `DuoAttentionPress` fed with a corelens head set instead of a pattern downloaded from
the DuoAttention repository: the KV heads of the top-`keep` heads keep the full cache, every other KV head keeps
its first `sink` and last `window` prompt tokens. A KV-granular set (`corelens rank --granularity kv`) names the
KV heads itself; for a query-head set `press.effective` (after the model is set up) states the asked and the
effective shares (`HeadSet.effective`: query heads, KV heads and cache bytes kept) and the ratio used. The values are those of the exported DuoAttention pattern
(`corelens.heads.formats.kv_values`, GQA mapping there), so `corelens export --to duo` and this press pick the
same KV heads.

    from corelens.integrations.kvpress import CorePress
    press = CorePress(heads="runs/headset", keep="10%", sink=4, window=64)   # or a hub id, or a HeadSet
    with press(m.model):
        out = m.model.generate(**inputs, max_new_tokens=32)

`PolicyPress` applies any registered corelens policy (`corelens.policies`: by name and fields, its JSON, or
the policy itself) as a kvpress-style press: `with PolicyPress("zero", heads=[[0, 5]])(m.model): ...`; a
policy that reads the prompt's positions (mean, knockout, adaptive hybrid, SAP) takes them from
`PolicyPress(..., prepared=prepare(m, sample), sample=sample)`.

What kvpress does with it (kvpress 0.5.5): the prefill runs full attention; after it, the streaming KV heads'
keys between the sink and the window are replaced at every decoding step by a key whose attention weight
underflows to 0 (kvpress's head-wise masking, `kvpress.attention_patch`). The cache tensors keep their shape:
per-head presses in kvpress save attention, not memory; `kept()` reports the keys each KV head still attends to.
corelens' own `HybridAttention(..., decode="stream")` session's `cache()` frees the memory instead.

Two adaptations, each for a measured incompatibility of kvpress 0.5.5 (which pins transformers < 5.3) with the
transformers this project pins: the decoder layers of transformers >= 5.3 pass the cache to attention as
`cache`, without `cache_position`, where kvpress's hook reads `past_key_values` and `cache_position`; and
kvpress wraps the attention functions registered when it is imported, so a model loaded by corelens before or
after that import gets kvpress's wrapper around the corelens attention function here.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from kvpress import DuoAttentionPress
from kvpress.attention_patch import attention_patch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from corelens.attention.dispatch import NAME
from corelens.errors import CorelensError
from corelens.heads import HeadSet
from corelens.heads.formats import kv_values
from corelens.metrics.headsets import k_count
from corelens.policies import Policy

# DuoAttentionPress arguments CorePress sets itself: given by the user, they would be silently overwritten.
OVERWRITTEN = {
    "head_compression_ratio": "CorePress sets it from the head set (the share of KV heads outside the top "
    "`keep`); choose the heads with keep= (a count or a share such as '10%')",
    "on_the_fly_scoring": "it makes DuoAttentionPress score heads itself and ignore the head set",
}


@dataclass
class CorePress(DuoAttentionPress):
    """DuoAttentionPress whose retrieval KV heads are the top `keep` heads of a corelens head set."""

    heads: HeadSet | str | Path | None = None
    keep: int | str | None = None  # a count or a share ("10%"); None: the set the artifact publishes
    sink: int = 128
    window: int = 1024
    headset: HeadSet | None = field(init=False, default=None)
    effective: dict | None = field(init=False, default=None)  # asked vs effective shares (HeadSet.effective)
    _lengths: dict[int, int] = field(init=False, default_factory=dict)  # prompt keys per layer, last prefill

    def __post_init__(self) -> None:
        # DuoAttentionPress's own fields come first: a head set given by position lands in one of them.
        if not isinstance(self.head_compression_ratio, (int, float)) or self.heads is None:
            raise CorelensError("CorePress needs heads=: a HeadSet, an exported folder or a hub id")
        for name, value in self._overwritten():
            raise CorelensError(
                f"CorePress: {name}={value!r} is not taken: {OVERWRITTEN[name]}; leave it out"
            )
        if self.sink < 0 or self.window < 1:
            raise CorelensError(f"need sink >= 0 and window >= 1, got sink={self.sink}, window={self.window}")
        self.headset = self.heads if isinstance(self.heads, HeadSet) else HeadSet.load(self.heads)
        if self.keep is not None:
            self.keep = k_count(self.keep, len(self.headset.heads))

    def _overwritten(self) -> list[tuple[str, Any]]:
        """Return the DuoAttentionPress arguments given a value that CorePress would overwrite or ignore."""
        defaults = {f.name: f.default for f in fields(DuoAttentionPress) if f.init}
        return [(name, getattr(self, name)) for name in OVERWRITTEN if getattr(self, name) != defaults[name]]

    def load_attention_pattern(self, model: Any) -> tuple[int, int, Any]:
        """Return (S, W, values per layer and KV head) from the head set (DuoAttentionPress downloads these)."""
        values = kv_values(self.headset, self.keep)
        # Stream exactly the KV heads outside the set: they hold the values below 0.5.
        self.head_compression_ratio = float((values < 0.5).mean())
        # A query-head set keeps every KV head with a full member: more of the cache than its size says.
        self.effective = self.headset.effective(self.keep, sink=self.sink, window=self.window)
        return self.sink, self.window, values

    def post_init_from_model(self, model: Any) -> None:
        """Check the model against the head set, then let DuoAttentionPress build its streaming mask."""
        config = model.config.get_text_config()
        shape = (config.num_hidden_layers, config.num_attention_heads)
        if shape != (self.headset.model["layers"], self.headset.model["heads"]):
            raise CorelensError(
                f"the head set is for {self.headset.model['layers']} x {self.headset.model['heads']} heads, "
                f"the model has {shape[0]} x {shape[1]}"
            )
        super().post_init_from_model(model)

    def forward_hook(self, module: torch.nn.Module, input: Any, kwargs: dict, output: Any) -> Any:
        """Run kvpress's hook, handing it the cache under the names it reads (see the module docstring)."""
        return super().forward_hook(module, input, cache_names(module, kwargs), output)

    @contextmanager
    def __call__(self, model: Any):
        """Apply the press to `model` for the duration of the block (kvpress's context manager)."""
        check_model(self.headset, model)
        head_masking()
        with super().__call__(model):
            yield

    def kept(self, model: Any) -> torch.Tensor:
        """Return (layers, KV heads): the prompt keys each KV head still attends to after the last prefill."""
        from corelens.models.loaded import decoder_attention_modules

        rows = []
        for module in decoder_attention_modules(model):
            length = self._lengths.get(module.layer_idx)
            kv = module.config.num_key_value_heads
            counts = torch.full((kv,), length, dtype=torch.long)
            masked = getattr(module, "masked_key_indices", None)
            if masked is not None:
                counts -= torch.bincount(masked[1].cpu(), minlength=kv)
            rows.append(counts)
        return torch.stack(rows)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """Record the prompt length per layer, then let DuoAttentionPress mark the streaming keys."""
        self._lengths[module.layer_idx] = keys.shape[2]
        return super().compress(module, hidden_states, keys, values, attentions, kwargs)


def check_model(headset: HeadSet, model: Any) -> None:
    """Refuse a model the head set was not found on, as the CLI does (`HeadSet.check`: identity, then shape),
    after switching its text attention to corelens' (with a note) or refusing one it cannot switch."""
    from corelens.models.loaded import as_loaded

    headset.check(as_loaded(model, "CorePress", with_processor=False))


def cache_names(module: torch.nn.Module, kwargs: dict) -> dict:
    """Return an attention layer's keyword arguments with the cache also under the names kvpress 0.5.5 reads
    (`past_key_values`, `cache_position`): the decoder layers of transformers >= 5.3 pass it as `cache`."""
    if "past_key_values" in kwargs or kwargs.get("cache") is None:
        return kwargs
    cache = kwargs["cache"]
    length = cache.get_seq_length(module.layer_idx)
    q_len = kwargs["hidden_states"].shape[1]
    return {**kwargs, "past_key_values": cache, "cache_position": torch.arange(length - q_len, length)}


def head_masking() -> None:
    """Wrap the corelens attention function with kvpress's head-wise masking (once; kvpress wraps only the
    functions registered when it was imported)."""
    from corelens.attention.dispatch import register

    register()
    function = ALL_ATTENTION_FUNCTIONS[NAME]
    if not getattr(function, "kvpress_masking", False):
        wrapped = attention_patch(function)
        wrapped.kvpress_masking = True
        ALL_ATTENTION_FUNCTIONS[NAME] = wrapped


def compatible(press: Any) -> Any:
    """Return `press`, any stock kvpress press (a `ComposedPress` and the presses in it too), made to run
    under the transformers corelens pins: its forward hook receives the cache under the names kvpress reads
    (`cache_names`), and the corelens attention function carries kvpress's head-wise masking.

    Examples:
        press = compatible(ComposedPress([CorePress(heads="runs/headset", keep=4), KnormPress(0.5)]))
        with press(m.model):
            out = m.model.generate(**inputs, max_new_tokens=32)
    """
    for inner in getattr(press, "presses", None) or []:
        compatible(inner)
    hook = press.forward_hook
    if not getattr(hook, "corelens_cache_names", False):

        def forward_hook(module: torch.nn.Module, input: Any, kwargs: dict, output: Any) -> Any:
            return hook(module, input, cache_names(module, kwargs), output)

        forward_hook.corelens_cache_names = True
        press.forward_hook = forward_hook
    head_masking()
    return press


class PolicyPress:
    """A corelens policy as a kvpress-style press: `with press(model): model.generate(...)`.

    `policy`: a `Policy`, a registered name (its fields as keyword arguments), a policy's JSON text or a
    JSON file. `prepared` / `sample`: the prompt whose positions the policy's hooks read (when it needs them).
    """

    def __init__(
        self, policy: Policy | str | Path, *, prepared: Any = None, sample: Any = None, **fields: Any
    ) -> None:
        if isinstance(policy, Policy):
            self.policy = policy
        elif isinstance(policy, Path) or (isinstance(policy, str) and policy.endswith(".json")):
            self.policy = Policy.from_file(policy)  # every field checked: one line naming file and field
        elif isinstance(policy, str) and policy.lstrip().startswith("{"):
            self.policy = Policy.from_json(policy, "PolicyPress policy")
        else:
            self.policy = Policy.from_dict({"name": policy, **fields})
        self.prepared, self.sample = prepared, sample

    @contextmanager
    def __call__(self, model: Any):
        """Apply the policy to `model` (a transformers model or a corelens `Loaded`) inside the block."""
        with self.policy.applied(model, self.prepared, sample=self.sample) as applied:
            yield applied
