"""The JSON Schemas published in docs/schemas/ are the ones corelens validates with (corelens.heads.schema)."""

from __future__ import annotations

import json
from pathlib import Path

from corelens.attention.schema import AblationFile, HybridPolicyFile, validate
from corelens.attention.streaming import HybridPolicy
from corelens.heads.schema import schemas
from corelens.policies import KnockoutHeads
from corelens.policies.legacy import ablation_policy

DOCS = Path(__file__).resolve().parents[1] / "docs" / "schemas"


def test_committed_schemas_equal_the_generated_ones():
    generated = schemas()
    assert sorted(p.name for p in DOCS.glob("*.json")) == sorted(generated)
    for name, schema in generated.items():
        # Regenerate with `python -m corelens.heads.schema docs/schemas` when a model changes.
        assert json.loads((DOCS / name).read_text()) == schema, name


def test_what_corelens_writes_validates():
    policy = HybridPolicy(((0, 1), (2, 3)), 4, 8, {"keep": 2})
    assert validate(HybridPolicyFile, policy.to_dict(), "p.json").full == [(0, 1), (2, 3)]
    ablation = {"heads": [[0, 1]], "op": "knockout", "keys": "omega", "label": "top/1", "seed": 3, "meta": {}}
    got = ablation_policy(validate(AblationFile, ablation, "a.json").model_dump())
    assert got == KnockoutHeads(((0, 1),), "top/1", 3, keys="omega")
