"""`headset.json` as a pydantic model, and the JSON Schemas of the artifacts corelens writes and reads.

`HeadSet.from_dict` validates a document against `HeadSetFile` (after its format check), so a missing field,
a field of the wrong type or a bad value is one line naming the file and the field. The heads' layer and head
indices are published as integers >= 0 and checked against the model's shape by `check_table` (which names the
entry, e.g. `heads[3]: head 9 is outside 0..7`); the model's layers and heads as positive integers.

The schemas in docs/schemas/ are generated from this model, the registered policies and the policy files of
`corelens.attention.schema` (`corelens.policies.json_schema`); tests/test_schemas.py checks that the committed
files equal the generated ones. Regenerate them with `python -m corelens.policies.json_schema docs/schemas`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from corelens.errors import CorelensError
from corelens.heads.spec import FORMAT, count

Name = Annotated[str | None, Field(default=None)]


def _positive(what: str):
    """Return a validator that takes a positive integer (not a bool, float or string), naming `what`."""

    def check(value: Any) -> int:
        try:
            return count(value, what)
        except CorelensError as err:
            raise ValueError(str(err)) from None

    return BeforeValidator(check)


Layers = Annotated[int, _positive("model.layers"), WithJsonSchema({"type": "integer", "minimum": 1})]
Heads = Annotated[int, _positive("model.heads"), WithJsonSchema({"type": "integer", "minimum": 1})]
KVHeads = Annotated[int, _positive("model.kv_heads"), WithJsonSchema({"type": "integer", "minimum": 1})]
# Checked with the model's shape by `check_table`, which names the entry: published as integers >= 0.
IndexCell = Annotated[Any, WithJsonSchema({"type": "integer", "minimum": 0})]
RankCell = Annotated[Any, WithJsonSchema({"type": "number"})]


class Identity(BaseModel):
    """The model's identity without its path (`corelens.runs.identity`)."""

    model_config = ConfigDict(extra="allow")
    digest: str = Field(description="sha256 (16 hex) of the config's content and the weights' metadata")
    id: Name = None
    commit: Name = None
    kind: Literal["folder", "object", "config"] | None = None
    config_digest: Name = None
    family: Name = None
    layers: Annotated[int, Field(strict=True, ge=1)] | None = None
    heads: Annotated[int, Field(strict=True, ge=1)] | None = None
    kv_heads: Annotated[int, Field(strict=True, ge=1)] | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="config field -> value or its digest")
    tensors: dict[str, str] | None = Field(None, description="tensor name -> DTYPE[shape]")
    files: dict[str, str] | None = Field(None, description="weight file -> 'size sha256'")
    content: dict[str, list[Annotated[float, Field(strict=True)]]] | None = Field(
        None, description="tensor name -> the fp32 values of its content fingerprint"
    )


class ModelRecord(BaseModel):
    """The model a head set was found on."""

    model_config = ConfigDict(extra="allow")
    id: Name = None
    revision: Name = None
    commit: Name = None
    model_type: Name = None
    config_hash: Name = Field(None, description="the identity's digest (an older corelens: a config hash)")
    layers: Layers
    heads: Heads
    kv_heads: KVHeads | None = None
    identity: Identity | None = None


class HeadRow(BaseModel):
    """One ranked head (or KV head): its layer, head, rank and any score column of heads.csv."""

    model_config = ConfigDict(extra="allow")
    layer: IndexCell
    head: IndexCell
    rank: RankCell


class HeadSetFile(BaseModel):
    """`headset.json` (format corelens.headset/1)."""

    model_config = ConfigDict(extra="allow", title="corelens head set")
    format: Literal["corelens.headset/1"] = Field(description="the format, " + FORMAT)
    model: ModelRecord
    keep: Annotated[int, Field(strict=True, ge=0)] | None = Field(None, description="the published top-k")
    heads: list[HeadRow]
    provenance: dict[str, Any] | None = None
