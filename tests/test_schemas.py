"""The JSON Schemas published in docs/schemas/ are the ones corelens validates with (corelens.heads.schema,
corelens.policies.json_schema: every registered policy and its fields)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar  # at module level: dataclasses read `ClassVar` from the test's module

from corelens.attention.schema import AblationFile, HybridPolicyFile, validate
from corelens.policies import KnockoutHeads
from corelens.policies.json_schema import schemas, write
from corelens.policies.legacy import ablation_policy

DOCS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


def test_committed_schemas_equal_the_generated_ones(tmp_path):
    """docs/schemas/ holds the head set's schema; the policy schema (it depends on what is registered) is
    written on demand, and the command that writes it writes both."""
    generated = schemas()
    assert sorted(p.name for p in DOCS.glob("*.json")) == ["headset.schema.json"]
    # Regenerate with `python -m corelens.policies.json_schema docs/schemas` when the head set model changes.
    assert json.loads((DOCS / "headset.schema.json").read_text()) == generated["headset.schema.json"]
    written = write(tmp_path)
    assert sorted(p.name for p in written) == ["headset.schema.json", "policy.schema.json"]
    assert json.loads((tmp_path / "policy.schema.json").read_text()) == generated["policy.schema.json"]


def test_what_corelens_writes_validates():
    old = Path(__file__).resolve().parent / "data" / "old_formats" / "hybrid-policy.json"  # HybridPolicy.save
    assert validate(HybridPolicyFile, json.loads(old.read_text()), "p.json").full[0] == (0, 5)
    ablation = {"heads": [[0, 1]], "op": "knockout", "keys": "omega", "label": "top/1", "seed": 3, "meta": {}}
    got = ablation_policy(validate(AblationFile, ablation, "a.json").model_dump())
    assert got == KnockoutHeads(((0, 1),), "top/1", 3, keys="omega")


def test_the_policy_schema_lists_every_registered_policy_and_a_new_one(monkeypatch):
    """Generated from the registry: each registered class by its name with its fields (what `to_dict` writes
    validates); a policy registered here appears with no other line written."""
    from dataclasses import dataclass, fields

    from corelens.policies import (
        POLICIES,
        HeadsPolicy,
        HybridAttention,
        PolicyInterface,
        SharedPrior,
        register,
    )
    from corelens.policies.json_schema import policy_model, policy_schema
    from corelens.policies.zero import ZeroHook

    def by_name(schema):
        defs = schema["$defs"]
        return {
            d["properties"]["name"]["const"]: d for d in defs.values() if "name" in d.get("properties", {})
        }

    listed = by_name(policy_schema())
    assert sorted(listed) == sorted(POLICIES)
    for name, cls in POLICIES.items():
        assert set(listed[name]["properties"]) == {"name"} | {f.name for f in fields(cls) if f.init}, name
    for policy in (
        KnockoutHeads(((0, 1),), keys="omega"),
        HybridAttention(((0, 1),), 4, 8),
        SharedPrior("noise"),
    ):
        assert policy_model(type(policy)).model_validate(policy.to_dict()).name == policy.name

    monkeypatch.setattr(PolicyInterface, "_global_mapping", dict(PolicyInterface._global_mapping))

    @register
    @dataclass(frozen=True)
    class Dim(HeadsPolicy):
        name: ClassVar[str] = "dim-test"
        factor: float = 0.5

        def hooks(self, model, context):
            return [ZeroHook(self.by_layer(model))]

    new = by_name(policy_schema())["dim-test"]
    assert new["properties"]["factor"] == {"default": 0.5, "title": "Factor", "type": "number"}
    assert new["additionalProperties"] is False  # `from_dict` refuses other keys
