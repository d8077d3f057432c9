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
import math
import numbers
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from corelens.data import jsonfile
from corelens.errors import CorelensError, InputError
from corelens.heads.artifact import HeadSet, count
from corelens.runs.files import folder, write_text, writer

DUO_TSV = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
SPARSEMM_SET = "sparsemm_heads.json"
SPARSEMM_SCORES = "sparsemm_head_score.json"
SPARSEMM_DIR = (
    "visual_head/head_score"  # where SparseMM's load_head_score opens its file (sparsemm_loader_file)
)
THRESHOLD = 0.5  # DuoAttention's default
# The most heads (layers x heads) a file may claim when the caller gives no model shape: far more than any model
# has (126 layers x 128 heads = 16,128), small enough that the table made from the claim stays in memory.
MAX_HEADS = 1 << 20
_LAYER = re.compile(r"[0-9]+")  # a SparseMM layer key: digits, no sign
_LAYER_HEAD = re.compile(r"([0-9]+)-([0-9]+)")  # a SparseMM score key "L-H"


def _read_json(path: Path, what: str) -> Any:
    """Read JSON for a head file; a repeated key, bad JSON or nesting too deep is one line naming the file."""

    try:
        return jsonfile.load(path)
    except InputError as err:
        raise CorelensError(f"{path}: cannot read {what} ({err.reason})") from None


def _shape(path: Path, layers: int, heads: int, given: bool) -> None:
    """Refuse a shape read from a file (not given by the caller) of more than MAX_HEADS heads, before any table."""
    if not given and layers * heads > MAX_HEADS:
        raise CorelensError(
            f"{path}: {layers} layers x {heads} heads is more than {MAX_HEADS} heads; "
            "pass the model's shape (layers=, heads=) to read it"
        )


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
    hs: HeadSet,
    out: str | Path,
    keep: int | None = None,
    *,
    sink: int = 128,
    window: int = 1024,
    root: str | Path | None = None,
) -> Path:
    """Write the top `keep` heads as a DuoAttention attention-pattern folder; return it.

    Nothing is written through a link leading out of `root` (the folder the user named; `out` by default).
    """
    out = folder(out, root)
    with writer(out / DUO_TSV, root=root or out) as f:
        np.savetxt(f, kv_values(hs, keep), delimiter="\t", fmt="%.6f")
    config = {"sink_size": int(sink), "recent_size": int(window), "num_attention_heads": hs.model["heads"]}
    config["corelens"] = {
        "model": hs.model,
        "keep": len(hs.top(keep)),
        "effective": hs.effective(keep, sink=sink, window=window),
    }
    write_text(out / DUO_CONFIG, json.dumps(config, indent=2) + "\n", root=root or out)
    return out


def read_duo(folder: str | Path, *, heads: int | None = None, threshold: float = THRESHOLD) -> HeadSet:
    """Return the head set of a DuoAttention pattern folder: KV heads at or above `threshold` are the set.

    `heads` (query heads per layer) is needed for a GQA model unless config.json records it. Values must be
    finite numbers; a `num_attention_heads` that is not a positive integer, or (without `heads`) implies more
    than `MAX_HEADS` heads, is refused before the table of heads is made.
    """
    folder = Path(folder)
    if not (folder / DUO_TSV).is_file():
        raise CorelensError(f"{folder}: not a DuoAttention pattern folder (no {DUO_TSV})")
    try:
        values = np.loadtxt(folder / DUO_TSV, dtype=float, delimiter="\t", ndmin=2)
    except ValueError as err:
        raise CorelensError(f"{folder / DUO_TSV}: not a table of numbers ({err})") from None
    if not np.isfinite(values).all():
        row, col = np.argwhere(~np.isfinite(values))[0]
        raise CorelensError(
            f"{folder / DUO_TSV}: row {row + 1}, column {col + 1} is {values[row, col]}, not a number"
        )
    values = np.clip(values, 0, 1)
    config = (
        _read_json(folder / DUO_CONFIG, "a DuoAttention config") if (folder / DUO_CONFIG).is_file() else {}
    )
    if not isinstance(config, dict):
        raise CorelensError(f"{folder / DUO_CONFIG}: expected a JSON object")
    layers, kv = values.shape
    claimed = config.get("num_attention_heads")
    if claimed is not None:
        claimed = count(claimed, f"{folder / DUO_CONFIG}: num_attention_heads")
    given = heads is not None
    heads = count(heads, "heads") if given else claimed or kv
    # Checked before the table of layers x heads rows is made: a claim of 1e9 heads allocates nothing.
    _shape(folder / DUO_CONFIG, layers, heads, given)
    if heads % kv:
        raise CorelensError(f"{folder}: {heads} query heads do not split over {kv} KV heads")
    group = heads // kv
    rows = [
        {"layer": layer, "head": head, "duo_value": values[layer, head // group]}
        for layer in range(layers)
        for head in range(heads)
    ]
    table = _ranked(pd.DataFrame(rows), "duo_value")
    extra = config.get("corelens") or {}
    known = extra.get("model") or {} if isinstance(extra, dict) else None
    if not isinstance(known, dict):
        raise CorelensError(f"{folder / DUO_CONFIG}: corelens.model must be an object")
    model = {**known, "layers": layers, "heads": heads, "kv_heads": kv}
    provenance = {"format": "duo-attention", "source": str(folder), "threshold": threshold}
    provenance.update(sink=config.get("sink_size"), window=config.get("recent_size"))
    return HeadSet(model, table, int((table["duo_value"] >= threshold).sum()), provenance)


def sparsemm_loader_file(hs: HeadSet) -> str | None:
    """Return the file SparseMM's `load_head_score(model_type)` opens for this head set's model, or None.

    SparseMM (gdace829/SparseMM at 89221e60d9f97b2ebc1521935e86ae5e447a9da1, `sparsemm/sparsemm_utils.py`)
    opens `./visual_head/head_score/` + `llava-v1.6.json` ("llava" in the model type), `llava-mistral-v1.6.json`
    ("llava" and "mistral") or `qwen.json` ("qwen"), relative to the folder it runs in. The model type is
    matched with the text model's type too (a LLaVA-NeXT on Mistral is `llava_next` over `mistral`).
    """
    config = (hs.model.get("identity") or {}).get("config") or {}
    kind = f"{hs.model.get('model_type') or ''} {config.get('text_config.model_type') or ''}".lower()
    if "llava" in kind:
        return (
            f"{SPARSEMM_DIR}/llava-mistral-v1.6.json"
            if "mistral" in kind
            else f"{SPARSEMM_DIR}/llava-v1.6.json"
        )
    return f"{SPARSEMM_DIR}/qwen.json" if "qwen" in kind else None


def write_sparsemm(
    hs: HeadSet, out: str | Path, keep: int | None = None, *, root: str | Path | None = None
) -> tuple[Path, Path]:
    """Write `sparsemm_heads.json` ({layer: [heads]} of the top `keep`) and `sparsemm_head_score.json`,
    never through a link leading out of `root` (`out` by default)."""
    out = folder(out, root)
    chosen: dict[str, list[int]] = {str(layer): [] for layer in range(hs.model["layers"])}
    for layer, head in hs.query_top(keep):  # a KV set: all query heads of its KV heads
        chosen[str(layer)].append(head)
    write_text(out / SPARSEMM_SET, json.dumps(chosen, indent=1) + "\n", root=root or out)
    write_text(out / SPARSEMM_SCORES, json.dumps(sparsemm_scores(hs)) + "\n", root=root or out)
    return out / SPARSEMM_SET, out / SPARSEMM_SCORES


def sparsemm_scores(hs: HeadSet) -> dict[str, list[float]]:
    """Return SparseMM's `{"L-H": [score]}` of every query head, layer-major (RAM mass, else minus the rank)."""
    by_head = hs.heads.sort_values(["layer", "head"])
    value = "mass" if "mass" in by_head.columns else "rank"
    scores = by_head[value].to_numpy(float) if value == "mass" else -by_head[value].to_numpy(float)
    layers, heads = by_head["layer"].to_numpy(int), by_head["head"].to_numpy(int)
    if hs.granularity == "kv":
        # SparseMM sums its query heads' scores per KV head: each member carries 1/group of its KV head's.
        group = hs.group
        layers, heads = np.repeat(layers, group), (heads[:, None] * group + np.arange(group)).ravel()
        scores = np.repeat(scores / group, group)
    return {f"{lyr}-{hd}": [float(s)] for lyr, hd, s in zip(layers, heads, scores)}


def write_sparsemm_loader(hs: HeadSet, out: str | Path, *, root: str | Path | None = None) -> Path | None:
    """Write the head scores (as `sparsemm_head_score.json`) under `out` where SparseMM's loader opens them
    (`sparsemm_loader_file`); return the file, or None for a model type SparseMM has no file for.

    Copy `out/visual_head/` into a SparseMM checkout: its scripts run from the checkout's root.
    """
    loader = sparsemm_loader_file(hs)
    if loader is None:
        return None
    target = Path(out) / loader
    folder(target.parent, root or out)
    return write_text(target, json.dumps(sparsemm_scores(hs)) + "\n", root=root or out)


def _scores(path: Path, data: dict, layers: int | None, heads: int | None) -> HeadSet:
    """The head set of SparseMM per-head scores `{"L-H": [score, ...]}`: every head once, ranked by mean score."""
    pairs, means = [], []
    for key, value in data.items():
        match = _LAYER_HEAD.fullmatch(key)
        if match is None:
            raise CorelensError(
                f"{path}: entry {key!r}: a score key is 'LAYER-HEAD' with non-negative integers"
            )
        ok = isinstance(value, list) and value
        if not ok or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in value
        ):
            raise CorelensError(f"{path}: entry {key!r}: scores must be a non-empty list of finite numbers")
        pairs.append((int(match[1]), int(match[2])))
        means.append(float(np.mean(value)))  # averaged per head, as SparseMM's loader does
    if len(set(pairs)) != len(pairs):
        repeated = next(p for p in pairs if pairs.count(p) > 1)
        raise CorelensError(f"{path}: L{repeated[0]}H{repeated[1]} has two entries")
    shape = {
        "layers": count(layers, "layers") if layers is not None else max(p[0] for p in pairs) + 1,
        "heads": count(heads, "heads") if heads is not None else max(p[1] for p in pairs) + 1,
    }
    outside = next((p for p in pairs if p[0] >= shape["layers"] or p[1] >= shape["heads"]), None)
    if outside is not None:
        raise CorelensError(
            f"{path}: entry '{outside[0]}-{outside[1]}' is outside {shape['layers']} layers x {shape['heads']} heads"
        )
    rows = [{"layer": lh[0], "head": lh[1], "sparsemm_score": m} for lh, m in zip(pairs, means)]
    try:
        return HeadSet(
            shape,
            _ranked(pd.DataFrame(rows), "sparsemm_score"),
            None,
            {"format": "sparsemm-scores", "source": str(path)},
        )
    except CorelensError as err:
        raise CorelensError(f"{path}: {err}") from None


def _chosen(path: Path, data: dict, layers: int | None, heads: int) -> tuple[int, set[tuple[int, int]]]:
    """Check a SparseMM `{layer: [heads]}` set against the model's shape; return (layers, the chosen heads)."""
    chosen: set[tuple[int, int]] = set()
    top = -1
    for key, value in data.items():
        if _LAYER.fullmatch(key) is None:
            raise CorelensError(f"{path}: entry {key!r}: a layer key is a non-negative integer")
        layer = int(key)
        if layers is not None and layer >= layers:
            raise CorelensError(f"{path}: entry {key!r}: layer {layer} is outside 0..{layers - 1}")
        if not isinstance(value, list) or not all(type(h) is int for h in value):
            raise CorelensError(f"{path}: entry {key!r}: the heads must be a list of integers, got {value!r}")
        for h in value:
            if not 0 <= h < heads:
                raise CorelensError(f"{path}: entry {key!r}: head {h} is outside 0..{heads - 1}")
            if (layer, h) in chosen:
                raise CorelensError(f"{path}: entry {key!r}: head {h} of layer {layer} is listed twice")
            chosen.add((layer, h))
        top = max(top, layer)
    return (layers if layers is not None else top + 1), chosen


def read_sparsemm(path: str | Path, *, heads: int | None = None, layers: int | None = None) -> HeadSet:
    """Return the head set of a SparseMM file: `{layer: [heads]}` (needs `heads`) or `{"L-H": [scores]}`.

    `layers` and `heads` give the model's shape; every layer and head of the file must lie inside it, and
    without them the shape the file implies may hold at most `MAX_HEADS` heads (checked before any table).
    Refused, naming the file and entry: a negative or non-integer layer or head, heads that are not a list of
    integers (`{"0": "12"}`), a head listed twice, and scores that are not finite numbers.
    """
    path = Path(path)
    data = _read_json(path, "a SparseMM head file")
    if not isinstance(data, dict) or not data:
        raise CorelensError(f"{path}: expected a JSON object of layers or 'L-H' heads")
    if all("-" in str(k) for k in data):
        # One row per entry of the file; the shape it implies is checked against the rows' count first.
        return _scores(path, data, layers, heads)
    if heads is None:
        raise CorelensError(f"{path}: a {{layer: [heads]}} file needs the number of heads per layer")
    heads = count(heads, "heads")
    given = layers is not None
    layers, chosen = _chosen(path, data, count(layers, "layers") if given else None, heads)
    # Before the layers x heads table: a layer key of 1e9 is outside the model, or (no shape given) too many.
    _shape(path, layers, heads, given)
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
