"""corelens: find, test and exploit the attention heads of multimodal LLMs that retrieve visual evidence."""

from __future__ import annotations

from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from corelens.lazy import lazy_names as _lazy_names

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


__getattr__ = _lazy_names(__name__, {**_DEPRECATED, **_EXPORTS}, globals())


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
