"""A policy's JSON checked against its registered class: every field's type, no other key, one line naming the
file and the field.

`policy_model(cls)` is the pydantic model of a registered policy's `to_dict()` (its `name` a constant, each
field of the dataclass with its type and default, no other key); `check(cls, data, where)` validates `data`
with it in strict JSON mode, so that a head written `"05"`, `5.0` or `true` is refused rather than read as
head 5 (heads are pairs of JSON integers), and returns the validated fields. `Policy.from_dict` calls it for
every policy, whatever registered it (docs/extending/policy.md); `corelens.policies.json_schema` writes the
same models as a JSON Schema.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, ValidationError, create_model

from corelens.attention.schema import one_line

if TYPE_CHECKING:
    from corelens.policies.core import Policy


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


def check(cls: type[Policy], data: dict, where: str) -> dict[str, Any]:
    """Return the fields of `data` (a policy's JSON, `name` included) validated against `cls`; raise one line
    naming `where` and the field otherwise. Data that is not JSON (Python objects given to `from_dict`) is
    checked in pydantic's lax Python mode."""
    model = policy_model(cls)
    try:
        try:
            text = json.dumps({"name": cls.name, **data}, allow_nan=False)
        except (TypeError, ValueError):
            checked = model.model_validate({"name": cls.name, **data})
        else:
            checked = model.model_validate_json(text, strict=True)
    except ValidationError as err:
        raise one_line(err, where) from None
    return {name: getattr(checked, name) for name in data}
