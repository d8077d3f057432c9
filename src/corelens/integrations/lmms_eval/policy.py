"""The policy a corelens lmms-eval model answers under: none, an ablation, a hybrid policy or a SAP prior.

Each answers one corelens `Sample` exactly as the matching corelens command does for that sample:
`corelens ablate` (the ablation with the sample's positions), `corelens hybrid` (the hybrid kernels with the
trimmed cache) and `corelens sap` (the prior on the chosen layers and heads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corelens.attention.hybrid import FORMAT as HYBRID_FORMAT
from corelens.attention.hybrid import HybridPolicy
from corelens.attention.interventions import OPS, Ablation, ablate
from corelens.attention.schema import AblationFile, HybridPolicyFile, SapFile, validate
from corelens.data.sample import Sample
from corelens.errors import CorelensError
from corelens.experiments.evaluate import answer
from corelens.models.loaded import Loaded
from corelens.models.prepare import prepare


@dataclass
class Policy:
    """What to apply while answering: `kind` is "none", "ablate", "hybrid" or "sap"; `spec` holds its data."""

    kind: str = "none"
    spec: Any = None
    means: str | None = None  # ablation op `mean`: a means.npz written by `corelens ablate`

    def answer(self, m: Loaded, sample: Sample, max_new_tokens: int) -> str:
        """Return the greedy answer to `sample` under this policy."""
        prepared = prepare(m, sample)
        if self.kind == "none":
            return answer(m, sample, max_new_tokens=max_new_tokens, prepared=prepared)
        if self.kind == "ablate":
            with ablate(m, self.spec, means=self.means) as ab, ab.for_sample(sample, prepared):
                return answer(m, sample, max_new_tokens=max_new_tokens, prepared=prepared)
        if self.kind == "hybrid":
            from corelens.experiments.hybrid import generate_answer

            return generate_answer(m, prepared, max_new_tokens, self.spec)[0]
        from corelens.experiments.sap import answer_with, build_prior

        prior = build_prior(m, sample, prepared, self.spec.prior)
        return answer_with(m, sample, prepared, prior, self.spec, max_new_tokens)


def _table(spec: str, m: Loaded):
    from corelens.experiments.ablate import read_heads
    from corelens.heads import resolve_heads

    return read_heads(resolve_heads(str(spec)), m)


def from_args(m: Loaded, args: dict[str, Any]) -> Policy:
    """Return the policy of lmms-eval model arguments (see the package docstring); unknown keys are an error."""
    from corelens.experiments.ablate import full_heads
    from corelens.metrics.headsets import k_count, select

    given = {k: v for k, v in args.items() if v is not None}
    kinds = [name for name, keys in (("policy", ("policy",)), ("ablate", ("heads",)), ("hybrid", ("full",)),
                                     ("sap", ("prior",))) if any(k in given for k in keys)]  # fmt: skip
    if len(kinds) > 1:
        raise CorelensError(f"give one policy, not {' and '.join(kinds)}")
    if not kinds:
        return Policy()
    if kinds == ["policy"]:
        return read_policy(given["policy"], means=given.get("means"))
    if kinds == ["ablate"]:
        op = str(given.get("op", "zero"))
        if op not in OPS:
            raise CorelensError(f"op={op}: expected one of {', '.join(OPS)}")
        table = _table(given["heads"], m)
        heads = select(table, "top", k_count(str(given.get("k", "5%")), len(table)))
        heads = full_heads(table, heads, m)  # a KV-head table: all query heads of each KV head
        ablation = Ablation(heads, op, str(given.get("keys", "visual")), label=f"top/{given.get('k', '5%')}")
        return Policy("ablate", ablation, given.get("means"))
    if kinds == ["hybrid"]:
        table = _table(given["full"], m)
        keep = str(given.get("keep", "10%"))
        sink, window = int(given.get("sink", 128)), int(given.get("window", 1024))
        return Policy("hybrid", HybridPolicy.from_heads(table, keep, sink=sink, window=window))
    from corelens.experiments.sap import Condition

    if "layers" not in given:
        raise CorelensError("prior=... needs layers=... (e.g. layers=1-3)")
    cond = Condition(str(given["prior"]), str(given["layers"]), str(given.get("sap_heads", "all")),
                     str(given.get("convention", "mass")))  # fmt: skip
    return Policy("sap", cond)


def read_policy(path: str | Path, means: str | None = None) -> Policy:
    """Return the policy in a JSON file: a hybrid policy (policies.json of `corelens hybrid` holds these),
    an ablation (`Ablation.to_json`) or a SAP condition ({"prior": ..., "layers": ...})."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CorelensError(f"policy={path}: cannot read a policy ({err})") from None
    if not isinstance(data, dict):
        raise CorelensError(f"policy={path}: expected a JSON object")
    where = f"policy={path}"
    if data.get("format") == HYBRID_FORMAT:
        validate(HybridPolicyFile, data, where)
        return Policy("hybrid", HybridPolicy.from_dict(data))
    if "heads" in data and "op" in data:
        return Policy("ablate", Ablation.from_dict(validate(AblationFile, data, where).model_dump()), means)
    if "prior" in data and "layers" in data:
        from corelens.experiments.sap import Condition

        return Policy("sap", Condition(**validate(SapFile, data, where).model_dump()))
    raise CorelensError(
        f"policy={path}: not a hybrid policy ({HYBRID_FORMAT}), an ablation (heads + op) or a SAP prior (prior + layers)"
    )
