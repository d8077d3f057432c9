"""Policies: what is applied to a model while it answers, one small registered class per intervention.

`POLICIES` maps each registered name to its class: `zero`, `mean`, `uniform`, `knockout` (head operators),
`hybrid`, `adaptive-hybrid`, `graded` and `sap`. `Policy.from_dict(d)` / `from_json` build any of them from JSON (the
dict carries `name`); `with policy.applied(m, prepared): ...` applies one; `answer(m, prepared, policy)` is
the greedy answer under one. A new policy is one file in this folder (imported, so registered, with the
package; docs/extending/policy.md).

Examples:
    >>> from corelens.policies import POLICIES, Policy, ZeroHeads
    >>> sorted(POLICIES)
    ['adaptive-hybrid', 'graded', 'hybrid', 'knockout', 'mean', 'sap', 'uniform', 'zero']
    >>> policy = ZeroHeads(heads=[(1, 0), (0, 1), (0, 1)])  # sorted, duplicates dropped
    >>> policy.to_dict()
    {'name': 'zero', 'heads': [[0, 1], [1, 0]], 'label': '', 'seed': None, 'meta': {}}
    >>> Policy.from_json(policy.to_json()) == policy  # any registered policy, by its name
    True
    >>> POLICIES["nope"]
    Traceback (most recent call last):
    ...
    corelens.errors.OptionError: unknown policy 'nope'; known: adaptive-hybrid, graded, hybrid, knockout, mean, sap, uniform, zero
"""

from corelens.policies.adaptive_hybrid import AdaptiveHybrid
from corelens.policies.core import POLICIES, Applied, Policy, PolicyInterface, answer, context_of, register
from corelens.policies.heads import HeadsHook, HeadsPolicy
from corelens.policies.hybrid_attention import HybridAttention
from corelens.policies.knockout import KnockoutHeads
from corelens.policies.mean import MeanHeads
from corelens.policies.sap_priors import PRIOR_CLASSES, Prior, build_prior, register_prior
from corelens.policies.shared_prior import SharedPrior
from corelens.policies.uniform import UniformHeads
from corelens.policies.zero import ZeroHeads
from corelens.registry import import_modules as _import_modules

# Every module of this folder registers its policies on import: a new file needs no line here.
_import_modules(__name__, __path__)

__all__ = [
    "POLICIES",
    "PRIOR_CLASSES",
    "AdaptiveHybrid",
    "Applied",
    "HeadsHook",
    "HeadsPolicy",
    "HybridAttention",
    "KnockoutHeads",
    "MeanHeads",
    "Policy",
    "PolicyInterface",
    "Prior",
    "SharedPrior",
    "UniformHeads",
    "ZeroHeads",
    "answer",
    "build_prior",
    "context_of",
    "register",
    "register_prior",
]
