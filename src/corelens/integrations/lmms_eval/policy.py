"""The policy a corelens lmms-eval model answers under: none, or any registered policy (`corelens.policies`).

It answers one corelens `Sample` exactly as the matching corelens command does for that sample, through the
one `corelens.policies.answer`: `corelens ablate` (the operator with the sample's positions), `corelens
hybrid` (the hybrid kernels with the trimmed cache) and `corelens sap` (the prior on the chosen layers and
heads). Model arguments name the policy as before (`heads=`, `full=`, `prior=`), or `policy=FILE.json` holds
any registered policy's JSON (`Policy.to_json`, with its `name`) or one of the older files (a hybrid policy
file, converted as `Policy.from_dict` converts it, an ablation, a SAP condition).

`policy_of(m, args)` / `load_policy(path)` return the registered policy itself (None: the model as it is) and
`answer_sample` answers under it. The wrapper type `Policy` and `from_args` / `read_policy`, which return
it, are deprecated (they warn and still work for one release).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from corelens.attention.interventions import OPS
from corelens.attention.schema import HYBRID_FORMAT, AblationFile, SapFile, validate
from corelens.data import jsonfile
from corelens.data.sample import Sample
from corelens.deprecation import deprecated
from corelens.errors import CorelensError
from corelens.experiments.ablate import full_heads, operator_policy, read_heads
from corelens.heads import resolve_heads
from corelens.metrics.headsets import k_count, select
from corelens.models.loaded import Loaded
from corelens.models.prepare import prepare
from corelens.policies import POLICIES, HybridAttention, MeanHeads, SharedPrior, answer
from corelens.policies import Policy as CorePolicy
from corelens.policies.legacy import ablation_policy


def answer_sample(m: Loaded, sample: Sample, policy: CorePolicy | None, max_new_tokens: int) -> str:
    """Return the greedy answer to `sample` under `policy` (None: the model as it is)."""
    return answer(m, prepare(m, sample), policy, sample=sample, max_new_tokens=max_new_tokens)


@dataclass
class Policy:
    """Deprecated: a registered policy (`policy`, None for the unmodified model) with `answer`; use the
    registered policy itself (`policy_of`, `load_policy`) and `answer_sample`."""

    policy: CorePolicy | None = None

    def __post_init__(self) -> None:
        deprecated(
            "corelens.integrations.lmms_eval.policy.Policy",
            "the registered policy itself (corelens.policies.Policy) and answer_sample",
        )

    def answer(self, m: Loaded, sample: Sample, max_new_tokens: int) -> str:
        """Return the greedy answer to `sample` under the policy."""
        return answer_sample(m, sample, self.policy, max_new_tokens)


def _wrapped(policy: CorePolicy | None) -> Policy:
    """Return the deprecated wrapper of `policy` without its warning (its caller has warned already)."""
    wrapper = Policy.__new__(Policy)
    wrapper.policy = policy
    return wrapper


def from_args(m: Loaded, args: dict[str, Any]) -> Policy:
    """Deprecated: `Policy(policy_of(m, args))`."""
    deprecated("corelens.integrations.lmms_eval.policy.from_args", "policy_of (the registered policy itself)")
    return _wrapped(policy_of(m, args))


def read_policy(path: str | Path, means: str | None = None) -> Policy:
    """Deprecated: `Policy(load_policy(path, means))`."""
    deprecated(
        "corelens.integrations.lmms_eval.policy.read_policy", "load_policy (the registered policy itself)"
    )
    return _wrapped(load_policy(path, means))


def _table(spec: str, m: Loaded):
    return read_heads(resolve_heads(str(spec)), m)


def _with_means(policy: CorePolicy, means: str | None) -> CorePolicy:
    """Return `policy` with the statistics of `means=` when it is a mean ablation (a means.npz path)."""
    return replace(policy, means=means) if isinstance(policy, MeanHeads) and means is not None else policy


def policy_of(m: Loaded, args: dict[str, Any]) -> CorePolicy | None:
    """Return the policy of lmms-eval model arguments (see the package docstring); unknown keys are an error."""
    given = {k: v for k, v in args.items() if v is not None}
    kinds = [name for name, keys in (("policy", ("policy",)), ("ablate", ("heads",)), ("hybrid", ("full",)),
                                     ("sap", ("prior",))) if any(k in given for k in keys)]  # fmt: skip
    if len(kinds) > 1:
        raise CorelensError(f"give one policy, not {' and '.join(kinds)}")
    if not kinds:
        return None
    if kinds == ["policy"]:
        return load_policy(given["policy"], means=given.get("means"))
    if kinds == ["ablate"]:
        op = str(given.get("op", "zero"))
        if op not in OPS:
            raise CorelensError(f"op={op}: expected one of {', '.join(OPS)}")
        table = _table(given["heads"], m)
        heads = select(table, "top", k_count(str(given.get("k", "5%")), len(table)))
        heads = full_heads(table, heads, m)  # a KV-head table: all query heads of each KV head
        keys = str(given.get("keys", "visual"))
        policy = operator_policy(op, keys, heads, label=f"top/{given.get('k', '5%')}")
        return _with_means(policy, given.get("means"))
    if kinds == ["hybrid"]:
        table = _table(given["full"], m)
        keep = str(given.get("keep", "10%"))
        sink, window = int(given.get("sink", 128)), int(given.get("window", 1024))
        return HybridAttention.from_heads(table, keep, sink=sink, window=window)
    if "layers" not in given:
        raise CorelensError("prior=... needs layers=... (e.g. layers=1-3)")
    return SharedPrior(str(given["prior"]), str(given["layers"]), str(given.get("sap_heads", "all")),
                       str(given.get("convention", "mass")))  # fmt: skip


def load_policy(path: str | Path, means: str | None = None) -> CorePolicy:
    """Return the policy in a JSON file: any registered policy (`Policy.to_json`, with its `name`, as the
    `policy` of each entry of `corelens hybrid`'s policies.json), an older hybrid policy file (`Policy.from_dict`
    converts it), an ablation (heads + op) or a SAP condition ({"prior": ..., "layers": ...})."""
    path = Path(path)
    try:
        data = jsonfile.load(path)  # a repeated key, a file too big or nested too deep: one line
    except CorelensError as err:
        raise CorelensError(f"policy={err}") from None
    if not isinstance(data, dict):
        raise CorelensError(f"policy={path}: expected a JSON object")
    where = f"policy={path}"
    if "format" in data:  # an old hybrid policy file: `Policy.from_dict` converts it (and warns)
        return CorePolicy.from_dict(data, where)
    if "heads" in data and "op" in data:
        return ablation_policy(validate(AblationFile, data, where).model_dump(), means)
    if "prior" in data and "layers" in data and "name" not in data:
        return SharedPrior(**validate(SapFile, data, where).model_dump())
    if "name" in data:  # a registered policy: its name (of any JSON type) is checked by from_dict
        return _with_means(CorePolicy.from_dict(data, where), means)  # every field checked, one line
    raise CorelensError(
        f"policy={path}: not a hybrid policy ({HYBRID_FORMAT}), a registered policy (name: "
        f"{', '.join(POLICIES)}), an ablation (heads + op) or a SAP prior (prior + layers)"
    )
