"""Head tables at KV-head granularity, and the effective shares of a head set on a GQA model.

Under grouped-query attention query head h of a layer reads KV head h // (heads / kv_heads) (transformers'
`repeat_kv` order). Tools that save KV-cache memory (DuoAttention, kvpress, corelens' own trimmed cache) decide
per KV head: a KV head can be trimmed only when every one of its query heads streams. Two consequences:

- `corelens rank --granularity kv` scores each KV head from its query heads (docs/methods.md#kv-heads). The
  rule (`RULES`) is applied per sample to the members' RAM, then averaged over samples like every score:
  `sum` (the default, as SparseMM sums its query heads' scores per KV head), `mean` (the same ranking, on the
  scale of one head) or `max` (the best member in each sample). The KV table keeps the columns of a query
  table (`head` is then the KV head) and adds `granularity` ("kv") and `query_heads` (its members).
- a set of query heads keeps more of the cache than its size says: `shares` reports the query heads full,
  the KV heads full (any member full) and the KV-cache bytes kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from corelens.choices import DEFAULT_RULE, GRANULARITIES, RULES
from corelens.errors import CorelensError, OptionError

COLUMN = "granularity"  # "kv" in every row of a KV-head table
MEMBERS = "query_heads"  # a KV head's query heads, space-separated ("4 5 6 7")

Head = tuple[int, int]


def group_size(heads: int, kv_heads: int | None) -> int:
    """Return the query heads per KV head; a model without GQA (kv_heads None or = heads) has groups of 1."""
    kv = kv_heads or heads
    if kv < 1 or heads % kv:
        raise CorelensError(f"cannot map {heads} query heads onto {kv} KV heads")
    return heads // kv


def check_granularity(granularity: str) -> str:
    """Return `granularity` when it is one of `GRANULARITIES`, else raise an OptionError naming the option."""
    if granularity not in GRANULARITIES:
        raise OptionError(f"--granularity: expected one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    return granularity


def granularity_of(table: pd.DataFrame) -> str:
    """Return "kv" for a KV-head table (its `granularity` column says so), else "query"."""
    if COLUMN in table.columns and (table[COLUMN] == "kv").any():
        return "kv"
    return "query"


def table_group(table: pd.DataFrame) -> int:
    """Return the query heads per KV head that a KV-head table records (its `query_heads` column)."""
    if MEMBERS not in table.columns or not len(table):
        raise CorelensError(f"a KV-head table needs its {MEMBERS} column (written by rank --granularity kv)")
    return len(str(table[MEMBERS].iloc[0]).split())


def kv_frame(ram: pd.DataFrame, group: int, rule: str = DEFAULT_RULE) -> pd.DataFrame:
    """Return the per-sample RAM table at KV granularity: `head` = KV head, `mass` = `rule` over its members.

    `share` and `lift` are the members' mean (a share is a ratio: summing it has no meaning); the per-view
    structs of the query table are not carried over (ram.parquet keeps them per query head).

    Examples:
        >>> ram = pd.DataFrame({"sample_id": "s", "task": "t", "layer": 0, "head": [0, 1, 2, 3],
        ...                     "mass": [0.1, 0.2, 0.3, 0.0], "share": 0.5, "lift": 1.0,
        ...                     "n_omega": 1, "n_visual": 4})
        >>> kv_frame(ram, 2)[["layer", "head", "mass"]].round(2).values.tolist()
        [[0.0, 0.0, 0.3], [0.0, 1.0, 0.3]]
        >>> kv_frame(ram, 2, "max")["mass"].tolist()
        [0.2, 0.3]
    """
    if rule not in RULES:
        raise OptionError(f"--kv-rule: expected one of {', '.join(RULES)}, got {rule!r}")
    keyed = ram.assign(head=ram["head"].to_numpy() // group)
    keys = ["sample_id", "task", "layer", "head"]
    out = (
        keyed.groupby(keys, sort=True)
        .agg(
            mass=("mass", rule),
            share=("share", "mean"),
            lift=("lift", "mean"),
            n_omega=("n_omega", "first"),
            n_visual=("n_visual", "first"),
        )
        .reset_index()
    )
    out["views"] = [[] for _ in range(len(out))]
    return out


def mark_kv(table: pd.DataFrame, group: int) -> pd.DataFrame:
    """Return a KV-head table with its `granularity` and `query_heads` columns (after `rank`)."""
    members = [" ".join(map(str, range(h * group, (h + 1) * group))) for h in table["head"].astype(int)]
    return table.assign(**{COLUMN: "kv", MEMBERS: members})


def kv_table(table: pd.DataFrame, group: int) -> pd.DataFrame:
    """Return the KV-head table of a query-head table: mass summed over members (rule `sum`), ranked again.

    The mean of per-sample sums is the sum of per-head means, so this equals `rank --granularity kv` with
    the default rule (share and lift: the members' mean of means). Ties are broken by (layer, KV head).
    """
    if granularity_of(table) == "kv":
        return table
    keyed = table.assign(head=table["head"].astype(int).to_numpy() // group)
    columns = {"mass": ("mass", "sum")} if "mass" in table.columns else {}
    columns.update({c: (c, "mean") for c in ("share", "lift") if c in table.columns})
    # A table without masses (an imported set) ranks a KV head by its best member's rank.
    columns["best"] = ("rank", "min")
    out = keyed.groupby(["layer", "head"], sort=True).agg(**columns).reset_index()
    by = -out["mass"].to_numpy(float) if "mass" in out.columns else out["best"].to_numpy(float)
    order = np.lexsort((out["head"].to_numpy(), out["layer"].to_numpy(), by))
    out = out.iloc[order].reset_index(drop=True).drop(columns="best")
    out["rank"] = np.arange(1, len(out) + 1)
    return mark_kv(out, group)


def expand(kv_set: Iterable[Head], group: int) -> tuple[Head, ...]:
    """Return the query heads of a set of (layer, KV head) pairs, sorted.

    Examples:
        >>> expand([(1, 0), (0, 1)], 2)
        ((0, 2), (0, 3), (1, 0), (1, 1))
    """
    return tuple(sorted((layer, kv * group + i) for layer, kv in kv_set for i in range(group)))


def kv_heads_of(full: Iterable[Head], group: int) -> set[Head]:
    """Return the (layer, KV head) pairs that a set of query heads keeps full (any member full)."""
    return {(int(layer), int(head) // group) for layer, head in full}


def cache_kept(kv_full: int, kv_total: int, tokens: int | None, sink: int, window: int) -> float:
    """Return the share of KV-cache bytes kept at a prompt of `tokens` (None: the limit of a long prompt).

    A full KV head keeps all `tokens` positions, a streaming one min(tokens, S + W) (`HybridCache`).
    """
    if tokens is None:
        return kv_full / kv_total
    stream = min(tokens, sink + window) / tokens if tokens else 1.0
    return (kv_full + (kv_total - kv_full) * stream) / kv_total


def shares(
    full: Iterable[Head],
    layers: int,
    heads: int,
    kv_heads: int | None,
    *,
    sink: int = 128,
    window: int = 1024,
    tokens: Sequence[int] | int | None = None,
) -> dict[str, float | int]:
    """Return the effective shares of a full set of query heads on a (layers, heads, kv_heads) model.

    `query_full` / `query_fraction`: query heads full (corelens' own kernels decide per query head);
    `kv_full` / `kv_fraction`: KV heads with a full member (they cannot be trimmed); `query_full_by_kv`: the
    query heads of those KV heads, which a tool deciding per KV head (DuoAttention, kvpress) runs full;
    `cache_kept_fraction`: KV-cache bytes kept, averaged over the prompt lengths `tokens` (None: the
    long-prompt limit, = `kv_fraction`).

    Examples:
        >>> s = shares([(0, 0), (0, 2), (1, 1)], 2, 4, 2)  # 3 of 8 query heads hold 3 of 4 KV heads
        >>> s["query_full"], s["kv_full"], s["kv_fraction"], s["query_full_by_kv"], s["cache_kept_fraction"]
        (3, 3, 0.75, 6, 0.75)
    """
    group = group_size(heads, kv_heads)
    full = {(int(layer), int(head)) for layer, head in full}
    kv_total = layers * heads // group
    kv_full = len(kv_heads_of(full, group))
    lengths = [tokens] if isinstance(tokens, int) else list(tokens) if tokens is not None else []
    if lengths:
        kept = float(np.mean([cache_kept(kv_full, kv_total, n, sink, window) for n in lengths]))
    else:
        kept = cache_kept(kv_full, kv_total, None, sink, window)
    return {
        "query_full": len(full),
        "query_fraction": len(full) / (layers * heads),
        "kv_full": kv_full,
        "kv_fraction": kv_full / kv_total,
        "query_full_by_kv": kv_full * group,
        "cache_kept_fraction": kept,
    }


def duo_sparsity(kv_full: int, kv_total: int) -> float:
    """Return the sparsity (DuoAttention `--sparsity`, kvpress `head_compression_ratio`) that keeps `kv_full`.

    Both tools stream the `sparsity` share of KV heads with the lowest values: DuoAttention's
    `sparsify_attention_heads` thresholds at the `sparsity` quantile of the values, kvpress prunes
    round(sparsity x KV heads). 1 - full / total selects exactly the full KV heads of an export whose full
    values lie above the streaming ones (`corelens.heads.formats.kv_values`).
    """
    return 1 - kv_full / kv_total
