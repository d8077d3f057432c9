"""The JSON Schema of a policy file, generated from the registry: every registered policy and its fields.

`policy_model(cls)` (`corelens.policies.validation`) is a pydantic model of one registered policy's `to_dict()` (its `name` as a constant,
each field of the dataclass with its type and default, no other key, as `Policy.from_dict` refuses others);
`policy_schema()` is the schema of every file `policy=FILE.json` reads: any registered policy, and the older
files (a hybrid policy, an ablation, a SAP condition; `corelens.attention.schema`). A new registered policy
appears with no line written here. Which policies a schema lists depends on what is registered (a user's own
policies included), so the policy schema is written on demand, never committed:
`python -m corelens.policies.json_schema DIR` writes it (and the head set's, which docs/schemas/ also holds)
into DIR.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Union

from pydantic import TypeAdapter

from corelens.attention.schema import POLICY_FILES
from corelens.heads.schema import HeadSetFile
from corelens.policies.core import POLICIES
from corelens.policies.validation import policy_model


def policy_schema(registry: Any = POLICIES) -> dict:
    """Return the JSON Schema of a policy file: each registered policy (by name), then the older files."""
    models = [policy_model(registry[name]) for name in sorted(registry)]
    schema = TypeAdapter(Union[(*models, *POLICY_FILES)]).json_schema()  # noqa: UP007 - built from a tuple
    schema["title"] = (
        "corelens policy (a registered policy by name, or a hybrid policy, ablation or SAP file)"
    )
    return schema


def schemas() -> dict[str, dict]:
    """Return {file name: JSON Schema} of the artifacts: headset.json and a policy file."""
    return {"headset.schema.json": HeadSetFile.model_json_schema(), "policy.schema.json": policy_schema()}


def write(folder: str | Path) -> list[Path]:
    """Write the schemas into `folder`; return their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, schema in schemas().items():
        (folder / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        out.append(folder / name)
    return out


if __name__ == "__main__":  # python -m corelens.policies.json_schema DIR
    for path in write(sys.argv[1] if len(sys.argv) > 1 else "."):
        print(path)
