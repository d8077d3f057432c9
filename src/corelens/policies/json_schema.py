"""The JSON Schema of a policy file, generated from the registry: every registered policy and its fields.

`policy_model(cls)` is a pydantic model of one registered policy's `to_dict()` (its `name` as a constant,
each field of the dataclass with its type and default, no other key, as `Policy.from_dict` refuses others);
`policy_schema()` is the schema of every file `policy=FILE.json` reads: any registered policy, and the older
files (a hybrid policy, an ablation, a SAP condition; `corelens.attention.schema`). A new registered policy
appears with no line written here. Which policies a schema lists depends on what is registered (a user's own
policies included), so the policy schema is written on demand, never committed:
`python -m corelens.policies.json_schema DIR` writes it (and the head set's, which docs/schemas/ also holds)
into DIR.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import ConfigDict, Field, TypeAdapter, create_model

from corelens.attention.schema import POLICY_FILES
from corelens.heads.schema import HeadSetFile
from corelens.policies.core import POLICIES, Policy


def _field(f: dataclasses.Field) -> Any:
    """Return the pydantic default of a dataclass field (required when it has none)."""
    if f.default is not dataclasses.MISSING:
        return Field(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return Field(default_factory=f.default_factory)
    return Field()


def _type(cls: type, f: dataclasses.Field) -> Any:
    """Return a field's type, its annotation evaluated in the module of the class that declares it.

    One annotation at a time: a class defined in a function may annotate other names (its `ClassVar`) with
    names its module lacks. A field whose annotation cannot be evaluated takes any value.
    """
    if not isinstance(f.type, str):
        return f.type
    owner = next((k for k in cls.__mro__ if f.name in vars(k).get("__annotations__", {})), cls)
    try:
        return eval(f.type, dict(vars(sys.modules[owner.__module__])))  # noqa: S307 - the class' own annotation
    except NameError:
        return Any


def policy_model(cls: type[Policy]) -> type:
    """Return the pydantic model of a registered policy's JSON (`cls.to_dict()`)."""
    fields = {
        f.name: (_type(cls, f), _field(f)) for f in dataclasses.fields(cls) if f.init and f.name != "name"
    }
    doc = (cls.__doc__ or "").strip().splitlines()
    return create_model(
        f"{cls.__name__}Policy",
        __config__=ConfigDict(
            extra="forbid", title=f"corelens policy {cls.name!r}", arbitrary_types_allowed=True
        ),
        __doc__=f"`{cls.__module__}.{cls.__name__}`" + (f": {doc[0]}" if doc else ""),
        name=(Literal[cls.name], Field(description="the registered policy name")),
        **fields,
    )


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
