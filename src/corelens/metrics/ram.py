"""RAM tables: per-sample long format and the per-head ranking (docs/methods.md#ram)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from corelens.errors import InputError

RAM_COLUMNS = ("sample_id", "task", "layer", "head", "mass", "share", "lift", "n_omega", "n_visual", "views")
# What a reader of ram.parquet needs of each column: the kind of its parquet type (checked by `read_ram`).
RAM_KINDS = {
    "sample_id": "text",
    "task": "text",
    "layer": "integer",
    "head": "integer",
    "mass": "number",
    "share": "number",
    "lift": "number",
    "n_omega": "integer",
    "n_visual": "integer",
}
RANKED = ("sample_id", "layer", "head", "mass", "share", "lift")  # what a per-head ranking reads


def _kind_of(kind: str, arrow_type) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):  # a pandas category column: judged by its values
        arrow_type = arrow_type.value_type
    if kind == "integer":
        return pa.types.is_integer(arrow_type)
    if kind == "number":
        return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
    # text; null: a column of None only (a task-less sample file)
    return (
        pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_null(arrow_type)
    )


def read_ram(path: str | Path, columns: Sequence[str] = RANKED, *, all_columns: bool = False) -> pd.DataFrame:
    """Read a rank run's per-sample RAM table after checking its schema; a file of another schema is one line.

    `columns` must be present with their kind of type (`RAM_KINDS`): the error names the file and every
    column missing or mistyped. Only `columns` are read unless `all_columns`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:  # not a parquet file, or a damaged one
        raise InputError(f"not a parquet file ({err})", file=str(path)) from None
    missing = [c for c in columns if c not in schema.names]
    mistyped = [
        f"{c} is {schema.field(c).type}, not {RAM_KINDS[c]}"
        for c in columns
        if c in schema.names and c in RAM_KINDS and not _kind_of(RAM_KINDS[c], schema.field(c).type)
    ]
    if missing or mistyped:
        problems = ([f"missing column(s) {', '.join(missing)}"] if missing else []) + mistyped
        raise InputError(f"not a rank run's RAM table: {'; '.join(problems)}", file=str(path))
    try:
        return pd.read_parquet(path, columns=None if all_columns else list(columns))
    except (pa.ArrowException, OSError) as err:  # a schema that reads but data that does not
        raise InputError(f"cannot read the RAM table ({err})", file=str(path)) from None


def _views(r: dict, layers: int, heads: int) -> list[list[dict]]:
    """Return per (layer, head), in row order, the list of one struct per view of record `r`."""
    labels = r.get("views") or []  # records logged before views were measured have none
    if not labels:
        return [[] for _ in range(layers * heads)]
    masses = np.asarray(r["view_mass"], dtype=np.float64).reshape(layers * heads, len(labels), 2)
    out = []
    for cell in masses:
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(cell[:, 0] > 0, cell[:, 1] / cell[:, 0], np.nan)
        out.append(
            [
                {
                    "view": label,
                    "mass": float(cell[i, 0]),
                    "omega_mass": float(cell[i, 1]),
                    "omega_share": float(share[i]),
                    "tokens": int(r["view_tokens"][i]),
                    "omega_tokens": int(r["view_omega"][i]),
                }
                for i, label in enumerate(labels)
            ]
        )
    return out


def sample_frame(records: Iterable[dict]) -> pd.DataFrame:
    """Return the long table (one row per sample, layer and head) from logged rank records.

    `views` holds one struct per view of the prompt: view, mass, omega_mass, omega_share (= omega_mass /
    mass), tokens and omega_tokens (the view's token counts in V and in Ω).

    Examples:
        >>> record = {"id": "s0", "task": "demo", "n_omega": 2, "n_visual": 8,
        ...           "mass": [[0.6, 0.1]], "share": [[0.9, 0.5]], "lift": [[3.6, 2.0]]}
        >>> sample_frame([record])[["sample_id", "layer", "head", "mass", "share", "lift"]]
          sample_id  layer  head  mass  share  lift
        0        s0      0     0   0.6    0.9   3.6
        1        s0      0     1   0.1    0.5   2.0
    """
    frames = []
    for r in records:
        mass = np.asarray(r["mass"], dtype=np.float64)
        layers, heads = mass.shape
        layer, head = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
        frames.append(
            pd.DataFrame(
                {
                    "sample_id": r["id"],
                    "task": r["task"],
                    "layer": layer.ravel(),
                    "head": head.ravel(),
                    "mass": mass.ravel(),
                    "share": np.asarray(r["share"], dtype=np.float64).ravel(),
                    "lift": np.asarray(r["lift"], dtype=np.float64).ravel(),
                    "n_omega": r["n_omega"],
                    "n_visual": r["n_visual"],
                    "views": _views(r, layers, heads),
                }
            )
        )
    if not frames:
        return pd.DataFrame({c: [] for c in RAM_COLUMNS})
    return pd.concat(frames, ignore_index=True)


def head_table(ram: pd.DataFrame, by: str = "mass") -> pd.DataFrame:
    """Return one row per (layer, head): means over samples and `rank` (1 = highest mean `by`).

    Examples:
        >>> records = [
        ...     {"id": f"s{i}", "task": "demo", "n_omega": 2, "n_visual": 8,
        ...      "mass": [[m0, m1]], "share": [[0.5, 0.5]], "lift": [[1.0, 1.0]]}
        ...     for i, (m0, m1) in enumerate([(0.2, 0.4), (0.4, 0.6)])
        ... ]
        >>> head_table(sample_frame(records))
           layer  head  mass  share  lift  n  rank
        0      0     1   0.5    0.5   1.0  2     1
        1      0     0   0.3    0.5   1.0  2     2
    """
    table = (
        ram.groupby(["layer", "head"], sort=True)
        .agg(mass=("mass", "mean"), share=("share", "mean"), lift=("lift", "mean"), n=("mass", "size"))
        .reset_index()
    )
    # Ties broken by (layer, head) so the ranking is deterministic.
    order = np.lexsort((table["head"].to_numpy(), table["layer"].to_numpy(), -table[by].to_numpy()))
    table["rank"] = 0
    table.loc[table.index[order], "rank"] = np.arange(1, len(table) + 1)
    return table.sort_values("rank").reset_index(drop=True)


def top_heads(heads: pd.DataFrame, k: int | float) -> list[tuple[int, int]]:
    """Return the top `k` (layer, head) pairs of a head table; a float in (0, 1) is a fraction of all heads.

    A fraction rounds to the nearest count, at least 1, as head sets of a sweep round it (1 % of 32 heads is
    one head, not none).

    Examples:
        >>> heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "rank": [3, 1, 2, 4]})
        >>> top_heads(heads, 2), top_heads(heads, 0.25)
        ([(0, 1), (1, 0)], [(0, 1)])
    """
    count = max(1, round(k * len(heads))) if isinstance(k, float) and 0 < k < 1 else int(k)
    best = heads.sort_values("rank").head(max(count, 0))
    return list(zip(best["layer"].astype(int), best["head"].astype(int)))
