"""corelens: find, test and exploit the attention heads of multimodal LLMs that retrieve visual evidence."""

from __future__ import annotations

from importlib import import_module as _import_module
from importlib.metadata import version as _version
from typing import TYPE_CHECKING

__version__ = _version("corelens")  # one source: pyproject.toml, as installed

# The public API, each name imported from its module on first use (PEP 562), so that `import corelens` and
# the command line's parser (`corelens --help`, an argument error) do not pay for torch and transformers.
_EXPORTS = {
    "AttentionHook": "corelens.attention.dispatch",
    "CorelensError": "corelens.errors",
    "HeadSet": "corelens.heads",
    "InputError": "corelens.errors",
    "Loaded": "corelens.models",
    "OptionError": "corelens.errors",
    "POLICIES": "corelens.policies",
    "Policy": "corelens.policies",
    "Ranking": "corelens.experiments.rank",
    "Sample": "corelens.data",
    "UnsupportedModelError": "corelens.errors",
    "activate": "corelens.attention.dispatch",
    "answer": "corelens.policies",
    "load": "corelens.models",
    "measure_sample": "corelens.experiments.rank",
    "prepare": "corelens.models.prepare",
    "rank": "corelens.experiments.rank",
    "read_samples": "corelens.data",
}
# Deprecated names, importable (each warns when used) until corelens.deprecation.REMOVED_IN, but not in
# `__all__`: `from corelens import *` and the documentation no longer offer them.
_DEPRECATED = {
    "Ablation": "corelens.policies.legacy",  # corelens.policies' head operators
    "ablate": "corelens.policies.legacy",  # `with policy.applied(m, prepared)`
    "hybrid": "corelens.policies.legacy",  # HybridAttention / AdaptiveHybrid
}
__all__ = [
    "POLICIES",
    "AttentionHook",
    "CorelensError",
    "HeadSet",
    "InputError",
    "Loaded",
    "OptionError",
    "Policy",
    "Ranking",
    "Sample",
    "UnsupportedModelError",
    "activate",
    "answer",
    "load",
    "measure_sample",
    "prepare",
    "rank",
    "read_samples",
]

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from corelens.attention.dispatch import AttentionHook, activate
    from corelens.data import Sample, read_samples
    from corelens.errors import CorelensError, InputError, OptionError, UnsupportedModelError
    from corelens.experiments.rank import Ranking, measure_sample, rank
    from corelens.heads import HeadSet
    from corelens.models import Loaded, load
    from corelens.models.prepare import prepare
    from corelens.policies import POLICIES, Policy, answer


def __getattr__(name: str):
    """Import a public name's module on first use and keep the name (later uses are plain lookups)."""
    module = _EXPORTS.get(name) or _DEPRECATED.get(name)
    if module is None:
        raise AttributeError(f"module 'corelens' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
