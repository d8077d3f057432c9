"""Head sets in the formats of two peers: DuoAttention attention patterns and SparseMM head files.

DuoAttention (mit-han-lab/duo-attention, `duo_attn/utils.py` at commit 03dca842639c64ed0d0daf9042da845cdea44637:
`load_attn_pattern`, `sparsify_attention_heads`; NVIDIA/kvpress `kvpress/presses/duo_attention_press.py` at
commit 00a150c3f3bb90313eafe2f61f9790ff232168e4) reads a folder with

- `full_attention_heads.tsv`: one row per layer, one tab-separated value in [0, 1] per **KV head** (clipped
  to [0, 1] on reading); DuoAttention keeps a KV head full when its value is >= a threshold (0.5 by default)
  or, given a sparsity, when it is above that quantile; kvpress's `DuoAttentionPress` streams the
  `head_compression_ratio` share of KV heads with the lowest values;
- `config.json` with `sink_size` and `recent_size` (S and W of the streaming heads).

A KV-granular head set (`corelens rank --granularity kv`) is written KV head by KV head: its top `keep` KV heads
are full. `config.json` records, under "corelens", the asked and the effective shares (query heads, KV heads and
cache bytes kept) and the `--sparsity` / `head_compression_ratio` that reproduces the set (`HeadSet.effective`).

GQA mapping: query head h of a layer reads KV head h // (heads / kv_heads) (transformers' `repeat_kv` order). A KV
head is written full when any of its query heads is in the set (a streaming KV head would take the keys from a
full query head); reading expands a full KV head to all its query heads. A set whose KV groups are all in or all
out therefore round-trips exactly, and any set round-trips on a model without GQA. The value of a KV head orders
it by its best query head's rank: full KV heads get values in (0.5, 1], the rest in (0, 0.5), so the default
threshold, and a compression ratio of 1 - (full KV heads / all KV heads), both select exactly the set.

SparseMM (gdace829/SparseMM at commit 89221e60d9f97b2ebc1521935e86ae5e447a9da1: `visual_head/qwen_visual_head.py`
writes, `sparsemm/sparsemm_utils.py` `load_head_score` reads) keeps per-head scores as `{"L-H": [score, ...]}`
in layer-major order, averaged per head on reading; its users ask for the plain set as `{layer: [heads]}`
(SparseMM issue 3). Both are written and read here: `sparsemm_heads.json` (the set) and
`sparsemm_head_score.json` (every head's RAM mass as its score). SparseMM sums the scores of a KV head's query
heads (`SparseMM.__init__` in `sparsemm_utils.py`): a KV-granular set writes 1/group of each KV head's score to
each member, so SparseMM reads back the KV scores, and its set lists every member query head.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from corelens.errors import CorelensError
from corelens.heads.artifact import HeadSet

DUO_TSV = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
SPARSEMM_SET = "sparsemm_heads.json"
SPARSEMM_SCORES = "sparsemm_head_score.json"
THRESHOLD = 0.5  # DuoAttention's default


def kv_values(hs: HeadSet, keep: int | None = None) -> np.ndarray:
    """Return the (layers, kv_heads) DuoAttention values of the top `keep` heads (see the module docstring)."""
    layers, heads, kv = hs.model["layers"], hs.model["heads"], hs.model["kv_heads"]
    if not kv or heads % kv:
        raise CorelensError(f"cannot map {heads} query heads onto {kv} KV heads")
    # A KV-granular set ranks the KV heads themselves: each row is its own group.
    group = 1 if hs.granularity == "kv" else heads // kv
    chosen = set(hs.top(keep))
    best = np.full((layers, kv), np.inf)
    full = np.zeros((layers, kv), dtype=bool)
    for layer, head, rank in hs.heads[["layer", "head", "rank"]].itertuples(index=False):
        best[layer, head // group] = min(best[layer, head // group], rank)
        full[layer, head // group] |= (layer, head) in chosen
    values = np.zeros((layers, kv))
    for mask, low in ((full, 0.5), (~full, 0.0)):
        order = np.argsort(best[mask], kind="stable")  # best rank first
        n = len(order)
        # Evenly spaced in (low, low + 0.5]: the best KV head of the group gets the top value.
        spread = np.empty(n)
        spread[order] = low + 0.5 * (n - np.arange(n)) / (n + (low == 0.0))
        values[mask] = spread
    return values


def write_duo(
    hs: HeadSet, out: str | Path, keep: int | None = None, *, sink: int = 128, window: int = 1024
) -> Path:
    """Write the top `keep` heads as a DuoAttention attention-pattern folder; return it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.savetxt(out / DUO_TSV, kv_values(hs, keep), delimiter="\t", fmt="%.6f")
    config = {"sink_size": int(sink), "recent_size": int(window), "num_attention_heads": hs.model["heads"]}
    config["corelens"] = {
        "model": hs.model,
        "keep": len(hs.top(keep)),
        "effective": hs.effective(keep, sink=sink, window=window),
    }
    (out / DUO_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_duo(folder: str | Path, *, heads: int | None = None, threshold: float = THRESHOLD) -> HeadSet:
    """Return the head set of a DuoAttention pattern folder: KV heads at or above `threshold` are the set.

    `heads` (query heads per layer) is needed for a GQA model unless config.json records it.
    """
    folder = Path(folder)
    if not (folder / DUO_TSV).is_file():
        raise CorelensError(f"{folder}: not a DuoAttention pattern folder (no {DUO_TSV})")
    values = np.clip(np.loadtxt(folder / DUO_TSV, dtype=float, delimiter="\t", ndmin=2), 0, 1)
    config = json.loads((folder / DUO_CONFIG).read_text()) if (folder / DUO_CONFIG).is_file() else {}
    layers, kv = values.shape
    heads = heads or config.get("num_attention_heads") or kv
    if heads % kv:
        raise CorelensError(f"{folder}: {heads} query heads do not split over {kv} KV heads")
    group = heads // kv
    rows = [
        {"layer": layer, "head": head, "duo_value": values[layer, head // group]}
        for layer in range(layers)
        for head in range(heads)
    ]
    table = _ranked(pd.DataFrame(rows), "duo_value")
    known = config.get("corelens", {}).get("model", {})
    model = {**known, "layers": layers, "heads": heads, "kv_heads": kv}
    provenance = {"format": "duo-attention", "source": str(folder), "threshold": threshold}
    provenance.update(sink=config.get("sink_size"), window=config.get("recent_size"))
    return HeadSet(model, table, int((table["duo_value"] >= threshold).sum()), provenance)


def write_sparsemm(hs: HeadSet, out: str | Path, keep: int | None = None) -> tuple[Path, Path]:
    """Write `sparsemm_heads.json` ({layer: [heads]} of the top `keep`) and `sparsemm_head_score.json`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen: dict[str, list[int]] = {str(layer): [] for layer in range(hs.model["layers"])}
    for layer, head in hs.query_top(keep):  # a KV set: all query heads of its KV heads
        chosen[str(layer)].append(head)
    (out / SPARSEMM_SET).write_text(json.dumps(chosen, indent=1) + "\n")
    by_head = hs.heads.sort_values(["layer", "head"])
    value = "mass" if "mass" in by_head.columns else "rank"
    scores = by_head[value].to_numpy(float) if value == "mass" else -by_head[value].to_numpy(float)
    layers, heads = by_head["layer"].to_numpy(int), by_head["head"].to_numpy(int)
    if hs.granularity == "kv":
        # SparseMM sums its query heads' scores per KV head: each member carries 1/group of its KV head's.
        group = hs.group
        layers, heads = np.repeat(layers, group), (heads[:, None] * group + np.arange(group)).ravel()
        scores = np.repeat(scores / group, group)
    per_head = {f"{lyr}-{hd}": [float(s)] for lyr, hd, s in zip(layers, heads, scores)}
    (out / SPARSEMM_SCORES).write_text(json.dumps(per_head) + "\n")
    return out / SPARSEMM_SET, out / SPARSEMM_SCORES


def read_sparsemm(path: str | Path, *, heads: int | None = None) -> HeadSet:
    """Return the head set of a SparseMM file: `{layer: [heads]}` (needs `heads`) or `{"L-H": [scores]}`."""
    path = Path(path)
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CorelensError(f"{path}: cannot read a SparseMM head file ({err})") from None
    if not isinstance(data, dict) or not data:
        raise CorelensError(f"{path}: expected a JSON object of layers or 'L-H' heads")
    if all("-" in str(k) for k in data):
        # Per-head scores, averaged per head as SparseMM's loader does; the ranking is the product.
        pairs = [tuple(map(int, k.split("-"))) for k in data]
        rows = [
            {"layer": lh[0], "head": lh[1], "sparsemm_score": float(np.mean(v))}
            for lh, v in zip(pairs, data.values())
        ]
        table = _ranked(pd.DataFrame(rows), "sparsemm_score")
        shape = {"layers": int(table["layer"].max()) + 1, "heads": int(table["head"].max()) + 1}
        return HeadSet(shape, table, None, {"format": "sparsemm-scores", "source": str(path)})
    if heads is None:
        raise CorelensError(f"{path}: a {{layer: [heads]}} file needs the number of heads per layer")
    try:
        chosen = {(int(layer), int(h)) for layer, hs in data.items() for h in hs}
    except (TypeError, ValueError):
        raise CorelensError(
            f"{path}: expected {{layer: [head, ...]}} with integer layers and heads"
        ) from None
    layers = max([int(k) for k in data] + [0]) + 1
    if any(h >= heads or h < 0 for _, h in chosen):
        raise CorelensError(f"{path}: a head index is outside 0..{heads - 1}")
    rows = [
        {"layer": lyr, "head": hd, "in_set": (lyr, hd) in chosen}
        for lyr in range(layers)
        for hd in range(heads)
    ]
    table = _ranked(pd.DataFrame(rows), "in_set")
    return HeadSet(
        {"layers": layers, "heads": heads}, table, len(chosen), {"format": "sparsemm", "source": str(path)}
    )


def _ranked(table: pd.DataFrame, by: str) -> pd.DataFrame:
    """Return `table` with `rank` (1 = highest `by`, ties by layer then head, as corelens ranks RAM)."""
    order = np.lexsort((table["head"].to_numpy(), table["layer"].to_numpy(), -table[by].to_numpy(float)))
    table = table.iloc[order].reset_index(drop=True)
    table["rank"] = np.arange(1, len(table) + 1)
    return table
