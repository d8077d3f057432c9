"""`Policy`: what is applied to a model while it answers, as small registered plain data.

A policy is a frozen dataclass with a registered `name`; `to_dict()` carries the name, so
`Policy.from_dict(d)` finds the class in the registry (`POLICIES`). `hooks(model, context)` returns the
attention hooks that apply it (each on the decoder layers of its `layers`, None: all); `with
policy.applied(model, prepared): ...` activates them for one prepared prompt, whose positions reach the
hooks through `AttentionCall.context` (`corelens.attention.prompt_context`). `answer(model, prepared, policy)` is
the one greedy answer under a policy that the commands, the integrations and the Python API share.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from corelens.attention.dispatch import AttentionHook, activate
from corelens.attention.prompt_context import AttentionContext, attention_context
from corelens.attention.schema import upgrade_hybrid_file
from corelens.errors import OptionError
from corelens.registry import NamedClasses, Registry, refuse_unknown_fields

if TYPE_CHECKING:
    from corelens.data.sample import Sample
    from corelens.models.prepare import Prepared


class PolicyInterface(NamedClasses, Registry):
    """name -> Policy class: the one registry idiom (`corelens.registry.Registry`, transformers'
    `GeneralInterface` shape), keyed by each class' `name`. `PolicyInterface.register(cls)` adds a class for
    every instance; `interface[name] = cls` overrides it in one instance only.
    """

    kind = "policy"


POLICIES = PolicyInterface()
register = PolicyInterface.register


def layer_modules(model: Any) -> list[tuple[int, torch.nn.Module]]:
    """Return the (layer index, attention module) pairs of a `Loaded` model or a bare transformers model."""
    if hasattr(model, "layer_modules"):
        return model.layer_modules()
    from corelens.attention.modules import decoder_attention_modules

    return list(enumerate(decoder_attention_modules(model)))


def on_corelens_attention(model: Any) -> None:
    """Switch the text attention of `model` (a `Loaded` or a bare transformers model) to corelens' with a
    note, or refuse in one line (`corelens.models.loaded.adopt`); a model already on it is left as it is."""
    from corelens.models.loaded import adopt

    target = model.model if hasattr(model, "layer_modules") else model
    if isinstance(target, torch.nn.Module):
        adopt(target)


def model_shape(model: Any) -> tuple[int, int]:
    """Return (decoder layers, query heads per layer) of a `Loaded` model or a bare transformers model."""
    if hasattr(model, "num_layers"):
        return model.num_layers, model.num_heads
    config = model.config.get_text_config()
    return config.num_hidden_layers, config.num_attention_heads


def context_of(
    prepared: Prepared | None, sample: Sample | None = None, rule: str = "any"
) -> AttentionContext:
    """Return the attention context of a prepared prompt; Omega (from `sample`'s targets) only when read."""
    if prepared is None:
        return None
    omega = None
    if sample is not None:
        omega = lambda: prepared.layout.omega(sample.targets, rule, sample=sample.id)  # noqa: E731
    return AttentionContext.of(prepared, omega, sample)


@dataclass
class Applied:
    """An applied policy: its active hooks and the context they read."""

    policy: Policy
    hooks: list[AttentionHook]
    context: AttentionContext | None
    sample: Any = None
    extra: dict = field(default_factory=dict)  # what a policy keeps while applied (e.g. a hybrid session)


@dataclass(frozen=True)
class Policy(abc.ABC):
    """Base class: a registered, frozen, JSON-ready description of an intervention (module docstring).

    Abstract: a policy defines `hooks`; an intermediate base (`HeadsPolicy`, `SessionPolicy`) stays abstract.
    """

    name: ClassVar[str] = ""

    @abc.abstractmethod
    def hooks(self, model: Any, context: AttentionContext | None) -> list[AttentionHook]:
        """Return the attention hooks that apply the policy to `model` (each on its `layers`)."""

    def generate_kwargs(self, applied: Applied) -> dict:
        """Return extra `generate` arguments while applied (e.g. a cache)."""
        return {}

    def report(self, applied: Applied) -> dict:
        """Return what the last generation under the policy measured (e.g. cache bytes saved)."""
        return {}

    @contextmanager
    def applied(
        self, model: Any, prepared: Prepared | None = None, *, sample: Sample | None = None, rule: str = "any"
    ) -> Iterator[Applied]:
        """Apply the policy to `model` inside the block, for the prompt `prepared` (of `sample`).

        A model whose text attention is not corelens' (a user's sdpa model, a kvpress pipeline's) is switched
        to it first, with the note `corelens.Loaded` gives, or refused in one line: the policy's hooks run
        inside the corelens attention function, so elsewhere they would silently change nothing.
        """
        on_corelens_attention(model)
        context = context_of(prepared, sample, rule)
        hooks = self.hooks(model, context)
        modules = layer_modules(model)
        with ExitStack() as stack:
            stack.enter_context(attention_context(context))
            for hook in hooks:
                chosen = [(i, mod) for i, mod in modules if hook.layers is None or i in hook.layers]
                stack.enter_context(activate(chosen, hook))
            yield Applied(self, hooks, context, sample)

    def to_dict(self) -> dict:
        """Return the policy as JSON-ready data, its registered `name` first."""
        data = json.loads(json.dumps(asdict(self)))  # tuples become lists
        return {"name": self.name, **data}

    def to_json(self) -> str:
        """Return the policy as a JSON string."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict, where: str = "policy") -> Policy:
        """Return the policy of `to_dict` data; on `Policy` itself, the class its `name` registers.

        An old hybrid policy file (format `corelens.hybrid-policy/1`) reads as the `hybrid` policy it holds
        (`corelens.attention.schema.upgrade_hybrid_file`). Every field is checked against the class (`corelens.policies.validation`): a wrong type, a head that
        is not a pair of integers or an unknown field is one line naming `where` (the file) and the field.
        """
        from corelens.policies.validation import check

        if not isinstance(data, dict):
            raise OptionError(f"{where}: a policy is a JSON object, got {type(data).__name__}")
        if "format" in data:  # an old hybrid policy file: converted, with a deprecation warning
            data = upgrade_hybrid_file(data, where)
        data = dict(data)
        name = data.pop("name", cls.name)
        if not isinstance(name, str) or name not in POLICIES:
            raise OptionError(f"{where}: field 'name': unknown policy {name!r}; expected one of "
                              f"{', '.join(sorted(POLICIES))}")  # fmt: skip
        target = POLICIES[name] if cls is Policy or name != cls.name else cls
        refuse_unknown_fields(target, data, f"{where}: policy {name!r}")
        try:
            return target(**check(target, data, where))
        except (TypeError, ValueError) as err:  # a class' own check (__post_init__) of a valid-typed field
            raise OptionError(f"{where}: not a valid {name!r} policy ({err})") from None

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "policy") -> Policy:
        """Return the policy of a `to_json` string (repeated keys, size and depth bounded: `data.jsonfile`)."""
        from corelens.data.jsonfile import loads

        return cls.from_dict(loads(text, where), where)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """Return the policy of a JSON file; anything wrong with it is one line naming the file and field."""
        from corelens.data.jsonfile import load

        return cls.from_dict(load(path), str(path))


def answer(
    model: Any,
    prepared: Prepared,
    policy: Policy | None = None,
    *,
    sample: Sample | None = None,
    max_new_tokens: int = 8,
    stats: dict | None = None,
) -> str:
    """Return the greedy answer to `prepared` under `policy` (None: the model as it is).

    New tokens only, special tokens dropped. `sample` gives the policies that need it its targets (Omega) or
    images (SAP priors); `stats`, when given, receives what the policy measured (`Policy.report`).
    """
    from corelens.models.loaded import as_loaded

    model = as_loaded(model, "corelens.answer")
    if model.processor is None:
        raise OptionError(
            "corelens.answer decodes with the model's processor: give corelens.Loaded.from_model(model, processor)"
        )
    inputs = {k: v.to(model.device) if hasattr(v, "to") else v for k, v in prepared.inputs.items()}
    gen = {"max_new_tokens": max_new_tokens, "do_sample": False}
    with torch.no_grad():
        if policy is None:
            out = model.model.generate(**inputs, **gen)
        else:
            with policy.applied(model, prepared, sample=sample) as on:
                out = model.model.generate(**inputs, **policy.generate_kwargs(on), **gen)
                if stats is not None:
                    stats.update(policy.report(on))
    new = out[0, inputs["input_ids"].shape[1] :]
    return model.processor.tokenizer.decode(new, skip_special_tokens=True).strip()
