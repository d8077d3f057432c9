"""The dense crossover from measured cost: per device, the prompt length below which the hybrid kernel loses.

The ideal speed-up (`masks.ideal_speedup`) counts pairs, not time: the hybrid path's fixed costs (launches,
a second pass, the streaming kernel's lower rate per pair) make it slower than stock sdpa at lengths where the
pair count still promises a gain. A `Crossover` is measured instead: from the benchmark's kernel tables
(`corelens bench hybrid` JSON at several lengths, `corelens.bench.crossover_table` writes the table), for each
measured full-head share F the shortest measured length from which the hybrid kernel was at least as fast as
stock sdpa at every longer measured length. Below it the dispatcher (`kernels.prefill`) runs every head dense
and reports ``dense``. A share between two measured ones takes the larger share's length (more full heads gain
less); a share past the largest measured one, or one that never won, always runs dense.

The table applies where `CORELENS_CROSSOVER` names its JSON file and its device is the one running
(`device_name`); elsewhere the ideal rule (`corelens.choices.DENSE_BELOW`) stands.

Examples:
    >>> rows = [{"tokens": n, "device": "cpu", "per_keep": {"0.2": {"full_fraction": 0.2, "speedup": s}}}
    ...         for n, s in ((4096, 0.7), (8192, 1.1), (16384, 1.6))]
    >>> table = Crossover.measured(rows)
    >>> table.length(0.2), table.length(0.1), table.length(0.6)
    (8192, 8192, inf)
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from corelens.errors import InputError

ENV = "CORELENS_CROSSOVER"
# The CUDA streaming paths a table may choose between (`partition.STREAMS` less the FlexAttention passes).
FAST_STREAMS = ("triton", "flash")


def device_name(device: torch.device) -> str:
    """Return the name a crossover table is measured on: the GPU's name on CUDA, else the device type."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


@dataclass(frozen=True)
class Crossover:
    """Per measured full-head share F (sorted), the length from which the hybrid kernel wins (inf: never)."""

    device: str
    shares: tuple[float, ...]
    lengths: tuple[float, ...]
    source: str = ""
    # The streaming heads' path measured faster on this device (`partitioned(stream=...)`, what `auto` runs):
    # "triton" (the default, also where the anatomy was not measured) or "flash".
    stream: str = "triton"

    def __post_init__(self) -> None:
        if self.stream not in FAST_STREAMS:
            raise InputError(
                f"crossover: unknown streaming path {self.stream!r}; expected one of {FAST_STREAMS}"
            )

    @classmethod
    def measured(cls, results: Iterable[dict], source: str = "") -> Crossover:
        """Return the table of kernel-table results (`corelens bench hybrid` JSON dicts) of one device."""
        speed: dict[float, dict[int, float]] = {}
        devices = set()
        for r in results:
            devices.add(str(r.get("device_name") or r.get("device", "")))
            for row in r["per_keep"].values():
                speed.setdefault(round(float(row["full_fraction"]), 6), {})[int(r["tokens"])] = float(
                    row["speedup"]
                )
        if len(devices) > 1:
            raise InputError(
                f"crossover: the results come from several devices {sorted(devices)}; give one's"
            )
        if not speed:
            raise InputError("crossover: no kernel table rows (per_keep) in the results")
        shares = tuple(sorted(speed))
        return cls(devices.pop(), shares, tuple(_wins_from(speed[f]) for f in shares), source)

    def length(self, share: float) -> float:
        """Return the length from which a head set with full-head share `share` runs hybrid (inf: never)."""
        for f, n in zip(self.shares, self.lengths):
            if share <= f + 1e-9:
                return n
        return math.inf

    def dense(self, n: int, share: float) -> bool:
        """Return whether an n-token prefill with full-head share `share` runs dense."""
        return n < self.length(share)

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "shares": list(self.shares),
            "lengths": [_num(n) for n in self.lengths],
            "stream": self.stream,
        }

    @classmethod
    def read(cls, path: str | Path) -> Crossover:
        """Return the table written by `to_json` at `path` (one-line error if it is missing or malformed)."""
        try:
            data = json.loads(Path(path).read_text())
            lengths = tuple(math.inf if n is None else float(n) for n in data["lengths"])
            return cls(
                str(data["device"]), tuple(float(f) for f in data["shares"]), lengths, str(path),
                str(data.get("stream", "triton")),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, InputError) as err:
            raise InputError(
                f"{path}: not a crossover table ({type(err).__name__}: {err}); write one with "
                "`python -m corelens.bench.crossover_table`"
            ) from None


def _wins_from(by_length: dict[int, float]) -> float:
    """Return the shortest measured length from which every longer measured length has speed-up >= 1."""
    wins = math.inf
    for n in sorted(by_length, reverse=True):
        if by_length[n] < 1.0:
            break
        wins = n
    return wins


def _num(n: float) -> int | None:
    return None if math.isinf(n) else int(n)


@lru_cache(maxsize=8)
def _load(path: str) -> Crossover:
    return Crossover.read(path)


def active(device: torch.device) -> Crossover | None:
    """Return the crossover table `CORELENS_CROSSOVER` names, if it was measured on `device`'s kind, else None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    table = _load(path)
    if table.device != device_name(device):
        warnings.warn(
            f"{path}: crossover measured on {table.device}, not on {device_name(device)}; using the ideal rule",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return table
