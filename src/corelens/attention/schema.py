"""The older policy files corelens reads, as pydantic models: a hybrid policy, an ablation and a SAP prior.

`validate(Model, data, where)` checks a JSON document against a model and turns the first violation into one
line naming the file and the field (`policy.json: field 'full[2][0]': Input should be ...`). The JSON Schemas
published in docs/schemas/ are generated from these models (`python -m corelens.policies.json_schema docs/schemas`).
An old hybrid policy file is read by one function, `upgrade_hybrid_file`, into the registered `hybrid` policy's
data (`HybridAttention.to_dict`), the one format corelens writes.

Examples:
    >>> validate(AblationFile, {"heads": [[0, 1]], "op": "zero"}, "p.json").op
    'zero'
    >>> validate(AblationFile, {"heads": [[0, -1]], "op": "zero"}, "p.json")
    Traceback (most recent call last):
    corelens.errors.CorelensError: p.json: field 'heads[0][1]': Input should be greater than or equal to 0 (got -1)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corelens.choices import KEY_SETS, OPS
from corelens.deprecation import deprecated
from corelens.errors import CorelensError

HYBRID_FORMAT = "corelens.hybrid-policy/1"  # the old hybrid policy file (read by `upgrade_hybrid_file` only)

Index = Annotated[int, Field(strict=True, ge=0)]  # a layer or head index: an integer >= 0, not 1.0 or true
Pair = tuple[Index, Index]
M = TypeVar("M", bound=BaseModel)


class HybridPolicyFile(BaseModel):
    """The old hybrid policy file (`HybridPolicy.save`, an older entry of `corelens hybrid`'s policies.json):
    full heads, streaming heads' S and W."""

    model_config = ConfigDict(extra="allow", title="corelens hybrid policy")
    format: Literal["corelens.hybrid-policy/1"] = Field(description="the format, " + HYBRID_FORMAT)
    full: list[Pair] = Field(description="the full-attention (layer, head) pairs")
    sink: Annotated[int, Field(strict=True, ge=0)] = Field(
        description="first prompt tokens a streaming head keeps"
    )
    window: Annotated[int, Field(strict=True, ge=1)] = Field(description="last tokens a streaming head keeps")
    source: dict[str, Any] = Field(default_factory=dict, description="where the full heads came from")


class AblationFile(BaseModel):
    """`Ablation.to_json`: the heads to ablate and how."""

    model_config = ConfigDict(extra="forbid", title="corelens ablation")
    heads: list[Pair] = Field(description="the ablated (layer, head) pairs")
    op: Literal[OPS] = Field(description="the ablation operator")  # type: ignore[valid-type]
    keys: Literal[KEY_SETS] = Field("visual", description="knockout: the key set")  # type: ignore[valid-type]
    label: str = ""
    seed: Annotated[int, Field(strict=True)] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class SapFile(BaseModel):
    """A SAP condition: the prior, on which layers and heads, under which convention."""

    model_config = ConfigDict(extra="forbid", title="corelens SAP prior")
    prior: str = Field(description="the prior (corelens sap --prior)")
    layers: str = Field(description="the layers, e.g. 1-3")
    heads: str = "all"
    convention: str = "mass"


POLICY_FILES = (HybridPolicyFile, AblationFile, SapFile)


def _where(loc: tuple) -> str:
    """Return a pydantic error location as a field path: ("heads", 2, "layer") -> "heads[2].layer"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def one_line(err: ValidationError, where: str) -> CorelensError:
    """Return the first violation of `err` as one line naming the file `where` and the field."""
    first = err.errors(include_url=False)[0]
    field = _where(first["loc"])
    if first["type"] == "missing":
        return CorelensError(f"{where}: field {field!r}: missing")
    message = first["msg"].removeprefix("Value error, ")
    if "got " in message:  # corelens' own checks quote the value already
        return CorelensError(f"{where}: field {field!r}: {message}")
    got = repr(first.get("input"))
    got = got if len(got) <= 40 else got[:37] + "..."
    return CorelensError(f"{where}: field {field!r}: {message} (got {got})")


def validate(model: type[M], data: Any, where: str) -> M:
    """Return `data` validated as `model`; the first violation is one line naming `where` and the field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise one_line(err, where) from None


def upgrade_hybrid_file(data: Any, where: str) -> dict[str, Any]:
    """Return the registered `hybrid` policy's data (`{"name": "hybrid", ...}`, as `HybridAttention.to_dict`
    writes it) of an old hybrid policy file, warning once that the format goes; the one reader of that format.

    Examples:
        >>> import warnings
        >>> old = {"format": HYBRID_FORMAT, "full": [[0, 1]], "sink": 4, "window": 8, "source": {"keep": "1"}}
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     upgrade_hybrid_file(old, "p.json")
        {'name': 'hybrid', 'full': [[0, 1]], 'sink': 4, 'window': 8, 'source': {'keep': '1'}}
        >>> str(caught[0].message)[:70]
        'p.json: the hybrid policy format corelens.hybrid-policy/1 is deprecate'
    """
    got = data.get("format") if isinstance(data, dict) else type(data).__name__
    if got != HYBRID_FORMAT:
        raise CorelensError(f"{where}: not a hybrid policy (format {got!r}, expected {HYBRID_FORMAT!r})")
    old = validate(HybridPolicyFile, data, where)
    deprecated(
        f"{where}: the hybrid policy format {HYBRID_FORMAT}",
        '{"name": "hybrid", ...} (HybridAttention.to_json; Policy.from_file(path).to_json() converts it)',
        stacklevel=4,
    )
    full = [list(p) for p in old.full]
    return {"name": "hybrid", "full": full, "sink": old.sink, "window": old.window, "source": old.source}
