"""Head sets of equal size from a head table (docs/methods.md#interventions): top-k, bottom-k, random-k, layer-matched random.

`k` is a count ("12") or a share of all L x H query heads ("5%", or a fraction like "0.05"); a share rounds to
the nearest count, at least 1. Random draws are deterministic: seeded by (base seed, task, set, count, draw),
so that every task and every run seed gets its own draws; the task enters as `task_seed` (a sha256 of its name,
the same in every process). The sweeps pass the task of their data (`corelens.data.sample.task_of`); without a
task (the Python API's default) the draws are seeded by (base seed, set, count, draw).

- random-k is drawn from all heads (docs/methods.md#interventions), so that it may contain CoRe heads as often as chance says;
  `random_from="non-top"` draws outside the top-k set instead (where fewer than k heads are outside it, the
  set is all of them, smaller than k).
- layer-matched-k takes, in each layer, as many heads as the top-k set has there, drawn from that layer's
  heads outside the top-k set; it never contains a top head. A layer with too few other heads gives all it
  has, so the set is smaller than k: `HeadSet.short_by` says by how many, and the sweeps write it to their
  tables.

`overlap` reports how many heads a set shares with the top-k set.
The optional "stable" set is not of equal size: the heads whose bootstrap probability of being in the top-k
(`p_top{k}`, written by `corelens rank --k`) is at least p (`short_by` says how many fewer than k).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from corelens.choices import OPTIONAL, RANDOM_FROM, SETS, STABLE_P
from corelens.errors import CorelensError, OptionError

SEEDED = ("random", "layer-matched")

Head = tuple[int, int]


@dataclass(frozen=True)
class HeadSet:
    """One set of heads to ablate: its kind, `k` as given, the head count, the seed (seeded kinds) and heads."""

    kind: str
    k: str
    count: int
    seed: int | None
    heads: tuple[Head, ...]
    overlap: int  # heads shared with the top-k set of the same count

    @property
    def short_by(self) -> int:
        """Return how many heads fewer than `count` the set holds (a control that ran out of heads)."""
        return self.count - len(self.heads)

    @property
    def name(self) -> str:
        """Return a unique label, e.g. "top/5%" or "random/5%/s3"."""
        return f"{self.kind}/{self.k}" + (f"/s{self.seed}" if self.seed is not None else "")


def label(heads: Iterable[Head]) -> str:
    """Return the heads of a set as one cell, e.g. "L0H3 L1H5" (the tables name the head sets drawn).

    Examples:
        >>> label([(1, 5), (0, 3)])
        'L0H3 L1H5'
    """
    return " ".join(f"L{layer}H{head}" for layer, head in sorted(heads))


def parse_k(text: str | Iterable[str]) -> list[str]:
    """Return the k values of a comma-separated list ("1%,2%,10") or a sequence, checked but not converted."""
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    items = [t for t in items if t]
    if not items:
        raise OptionError("give at least one head count (8) or share (5%)")
    for item in items:
        k_value(item)  # validates the syntax; the counts are checked against a model's heads later
    return items


def k_value(k: str | int | float) -> int | float:
    """Return `k` as a count (an int, at least 1) or a share (a float in (0, 1]): "8" -> 8, "5%" / 0.05 -> 0.05."""
    text = str(k).strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
        else:
            value = float(text)
            if value.is_integer() and value >= 1:
                return int(value)
            share = value
    except ValueError:
        raise OptionError(f"bad k {text!r}: expected a count (8) or a share (5% or 0.05)") from None
    if not 0 < share <= 1:
        raise OptionError(f"bad k {text!r}: a share must be in (0, 100 %]")
    return share


def k_count(k: str | int | float, total: int) -> int:
    """Return the number of heads `k` means among `total` heads ("5%" / 0.05 = a share, "8" / 8 = a count).

    Examples:
        >>> k_count("25%", 8), k_count(3, 8), k_count(0.01, 32)  # a share rounds to at least one head
        (2, 3, 1)
    """
    value = k_value(k)
    if isinstance(value, float):
        return max(1, round(value * total))
    if value > total:
        raise CorelensError(f"k = {str(k).strip()} exceeds the {total} heads of the model")
    return value


def _ordered(table: pd.DataFrame) -> list[Head]:
    missing = {"layer", "head", "rank"} - set(table.columns)
    if missing:
        raise CorelensError(f"the head table lacks column(s) {sorted(missing)}")
    best = table.sort_values("rank")
    return list(zip(best["layer"].astype(int), best["head"].astype(int)))


def task_seed(task: str) -> int:
    """Return a task name as a stable 64-bit integer (sha256; Python's hash() differs between processes).

    Examples:
        >>> task_seed("image") == task_seed("image") != task_seed("video")
        True
    """
    return int.from_bytes(hashlib.sha256(task.encode("utf-8")).digest()[:8], "big")


def _rng(seed: int, kind: str, count: int, draw: int, task: str | None = None) -> np.random.Generator:
    # The task enters the seed so that two tasks (or two runs with other seeds) never share their draws.
    key = [seed, SETS.index(kind), count, draw]
    return np.random.default_rng(key if task is None else [seed, task_seed(task), *key[1:]])


def stable(table: pd.DataFrame, count: int, p: float = STABLE_P) -> tuple[Head, ...]:
    """Return the heads whose P(top-`count`) is at least `p` (column `p_top{count}` of the head table)."""
    column = f"p_top{count}"
    if column not in table.columns:
        raise CorelensError(f"the head table has no {column} column: rank with --k {count} to write it")
    if not 0 < p <= 1:
        raise CorelensError(f"--stable-p must be in (0, 1], got {p}")
    chosen = table[table[column] >= p]
    return tuple(sorted(zip(chosen["layer"].astype(int), chosen["head"].astype(int))))


def select(
    table: pd.DataFrame,
    kind: str,
    count: int,
    seed: int | None = None,
    *,
    base_seed: int = 0,
    random_from: str = "all",
    p: float = STABLE_P,
    task: str | None = None,
) -> tuple[Head, ...]:
    """Return up to `count` heads of `kind` from a head table (rank 1 = best); seeded kinds need `seed`.

    top / bottom / random from all heads hold exactly `count`; layer-matched and random from non-top heads
    may hold fewer (see the module docstring). Kind "stable" returns the heads with P(top-`count`) >= `p`.
    Seeded kinds draw from (`base_seed`, `task`, kind, `count`, `seed`).

    Examples:
        >>> table = pd.DataFrame({"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2,
        ...                       "rank": [1, 5, 2, 6, 3, 7, 4, 8]})
        >>> select(table, "top", 2), select(table, "bottom", 2)
        (((0, 0), (0, 2)), ((1, 1), (1, 3)))
        >>> select(table, "layer-matched", 2, seed=0)  # both top heads are in layer 0
        ((0, 1), (0, 3))
    """
    if kind == "stable":
        return stable(table, count, p)
    order = _ordered(table)
    if not 0 <= count <= len(order):
        raise CorelensError(f"cannot pick {count} heads out of {len(order)}")
    if random_from not in RANDOM_FROM:
        raise CorelensError(f"unknown --random-from {random_from!r}; expected one of {RANDOM_FROM}")
    top = order[:count]
    if kind == "top":
        return tuple(sorted(top))
    if kind == "bottom":
        return tuple(sorted(order[len(order) - count :]))
    if kind not in SEEDED:
        raise CorelensError(f"unknown head set {kind!r}; expected one of {SETS}")
    if seed is None:
        raise CorelensError(f"head set {kind!r} needs a seed")
    rng = _rng(base_seed, kind, count, seed, task)
    top_set = set(top)
    rest = [h for h in sorted(order) if h not in top_set]
    if kind == "random":
        pool = sorted(order) if random_from == "all" else rest
        picks = rng.choice(len(pool), size=min(count, len(pool)), replace=False)
        return tuple(sorted(pool[i] for i in picks))
    chosen: list[Head] = []
    for layer in sorted({h[0] for h in top}):
        need = sum(1 for h in top if h[0] == layer)
        free = [h for h in rest if h[0] == layer]
        # A layer with fewer non-top heads than it has top heads gives all it has: the set comes up short.
        chosen += [free[i] for i in rng.choice(len(free), size=min(need, len(free)), replace=False)]
    return tuple(sorted(chosen))


def head_sets(
    table: pd.DataFrame,
    ks: Sequence[str],
    kinds: Sequence[str] = SETS,
    seeds: int | Sequence[int] = 5,
    *,
    base_seed: int = 0,
    random_from: str = "all",
    stable_p: float = STABLE_P,
    task: str | None = None,
) -> list[HeadSet]:
    """Return every head set of the sweep: for each k, each kind (seeded kinds once per draw 0..seeds-1, or
    once per draw index of a sequence: the later batches of `--seeds auto`), drawn for `task`.

    Examples:
        >>> table = pd.DataFrame({"layer": [0] * 4 + [1] * 4, "head": [0, 1, 2, 3] * 2,
        ...                       "rank": [1, 5, 2, 6, 3, 7, 4, 8]})
        >>> for s in head_sets(table, ["25%"], seeds=2):
        ...     print(s.name, s.heads, "overlap", s.overlap)
        top/25% ((0, 0), (0, 2)) overlap 2
        bottom/25% ((1, 1), (1, 3)) overlap 0
        random/25%/s0 ((0, 0), (0, 1)) overlap 1
        random/25%/s1 ((0, 1), (1, 2)) overlap 0
        layer-matched/25%/s0 ((0, 1), (0, 3)) overlap 0
        layer-matched/25%/s1 ((0, 1), (0, 3)) overlap 0
    """
    unknown = [k for k in kinds if k not in SETS + OPTIONAL]
    if unknown:
        raise CorelensError(f"unknown head set(s) {unknown}; expected some of {SETS + OPTIONAL}")
    total = len(table)
    draws = range(seeds) if isinstance(seeds, int) else list(seeds)
    out = []
    for k in ks:
        count = k_count(k, total)
        top = set(select(table, "top", count))
        for kind in kinds:
            for seed in draws if kind in SEEDED else [None]:
                heads = select(
                    table,
                    kind,
                    count,
                    seed,
                    base_seed=base_seed,
                    random_from=random_from,
                    p=stable_p,
                    task=task,
                )
                out.append(HeadSet(kind, str(k), count, seed, heads, len(top & set(heads))))
    return out
