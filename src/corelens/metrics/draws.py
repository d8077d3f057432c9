"""How many draws a random control needs: `--seeds auto` (docs/methods.md#control-head-sets).

A random or layer-matched control is a mean over drawn head sets, and draws can differ a lot (a draw that
holds a causal head answers far worse than one that does not). `--seeds auto` draws sets in batches until
the 95 % t-interval of the mean accuracy over the draws (each draw's accuracy on the same samples) is at most
`--control-width` wide, or `--max-draws` is reached. The t-interval over draw means is what more draws
narrow; the interval a table reports for the control (`draws_interval`, the two-level bootstrap over draws
and samples) also holds the sampling of questions, which no number of draws removes.

Every choice is a function of the logged answers, so a resumed run draws the same sets and stops at the same
count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corelens.choices import MAX_COUNT
from corelens.errors import OptionError

if TYPE_CHECKING:
    import pandas as pd

# numpy, scipy and the head sets are imported where they are used: the command line parses --draws and
# --control-width with this module's functions, and `corelens ablate --help` must not pay for them.

AUTO = "auto"
FIRST = 10  # draws before the first check: a batch of 5 misses a head held by 1 set in 3 about 1 time in 8
BATCH = 5  # draws added per round while a control is wider than the target
MAX_DRAWS = 40
WIDTH = 0.10  # the default target: the mean over draws known to within +-5 points
LEVEL = 0.95


def seeds_arg(text: str) -> int | str:
    """Parse `--draws` (alias `--seeds`): "auto" or a count of draws (at least 1).

    Examples:
        >>> seeds_arg("auto"), seeds_arg("5")
        ('auto', 5)
    """
    text = str(text).strip().lower()
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"--draws {text!r}: expected a count of draws (5) or auto") from None
    if value < 1:
        raise OptionError(f"--draws {value}: at least 1 draw (or auto)")
    if value > MAX_COUNT:
        raise OptionError(f"--draws {value}: at most {MAX_COUNT} draws (more buy no precision; or auto)")
    return value


def width_arg(text: str) -> float:
    """Parse `--control-width`: a width of accuracy in (0, 1] (0.10 = the mean over draws to within +-5 points)."""
    try:
        value = float(text)
    except ValueError:
        raise OptionError(f"--control-width {text!r}: expected a width of accuracy such as 0.10") from None
    if not 0 < value <= 1:
        raise OptionError(f"--control-width {value}: expected a width of accuracy in (0, 1], e.g. 0.10")
    return value


def check(seeds: int | str, width: float, cap: int) -> None:
    """Refuse settings that cannot run: an unknown `seeds`, a width outside (0, 1], a cap below `FIRST`."""
    if seeds != AUTO and not (isinstance(seeds, int) and seeds >= 1):
        raise OptionError(f"--draws {seeds!r}: expected a count of draws (at least 1) or auto")
    width_arg(str(width))
    if seeds == AUTO and cap < FIRST:
        raise OptionError(f"--max-draws {cap}: at least {FIRST} (auto draws {FIRST} before the first check)")


def first_draws(seeds: int | str, cap: int = MAX_DRAWS) -> range:
    """Return the draw indices of the first round: all of a fixed count, or the first `FIRST` under auto."""
    return range(min(FIRST, cap) if seeds == AUTO else int(seeds))


def draw_interval(accuracies: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Return the t-interval of the mean over draws of their accuracies (nan for fewer than 2 draws).

    Examples:
        >>> low, high = draw_interval([0.5, 0.7, 0.6, 0.6])
        >>> round(low, 3), round(high, 3)
        (0.47, 0.73)
    """
    import numpy as np
    from scipy import stats

    values = np.asarray(accuracies, dtype=np.float64)
    n = len(values)
    if n < 2:
        return math.nan, math.nan
    half = stats.t.ppf((1 + level) / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return float(values.mean() - half), float(values.mean() + half)


def known(width: float) -> str:
    """Say how well the mean over draws is known, from the width of its 95 % interval (accuracy in [0, 1]).

    Examples:
        >>> known(0.048), known(4.765), known(float("nan"))
        ('known to ±2.4 points (95 %)', 'not known yet (too few draws to bound it)', 'not known yet (too few draws to bound it)')
    """
    if not width <= 1:  # nan (one draw) or an interval wider than the accuracy scale (two draws that differ)
        return "not known yet (too few draws to bound it)"
    return f"known to ±{50 * width:.1f} points (95 %)"


@dataclass(frozen=True)
class Control:
    """Where one control (set, k) stands: its draws, the width of `draw_interval` and why it stopped."""

    kind: str
    k: str
    draws: int
    width: float
    stopped: str  # "width" (target met), "cap" (--max-draws reached first), "fixed" (an integer --seeds)

    def line(self, target: float, cap: int) -> str:
        """Return the stderr line that reports it."""
        text = f"{self.kind} k={self.k}: {self.draws} draws, mean accuracy over draws {known(self.width)}"
        if self.stopped == "cap":
            return text + f"; stopped by --max-draws {cap} before --control-width {target:g}"
        return text + (f" <= --control-width {target:g}" if self.stopped == "width" else "")


def status(accuracies: Sequence[float], kind: str, k: str, target: float, cap: int, auto: bool) -> Control:
    """Return the `Control` of one set's draw accuracies under the target width and the cap."""
    low, high = draw_interval(accuracies)
    width = high - low  # nan for one draw: nothing says how far draws differ
    if not auto:
        return Control(kind, k, len(accuracies), width, "fixed")
    if width <= target:
        return Control(kind, k, len(accuracies), width, "width")
    return Control(kind, k, len(accuracies), width, "cap" if len(accuracies) >= cap else "more")


def more(control: Control, cap: int) -> range:
    """Return the draw indices of the next batch of a control still wider than its target (empty if none)."""
    if control.stopped != "more":
        return range(0)
    return range(control.draws, min(control.draws + BATCH, cap))


def controls(table: pd.DataFrame, key: str, target: float, cap: int, auto: bool) -> list[Control]:
    """Return the `Control` of each drawn (set, `key`) group of a result table (one row per draw, `accuracy`)."""
    from corelens.metrics.headsets import SEEDED

    drawn = table[table["set"].isin(SEEDED)]
    return [
        status(group["accuracy"].tolist(), kind, str(k), target, cap, auto)
        for (kind, k), group in drawn.groupby(["set", key], sort=False)
    ]


def manifest(found: Sequence[Control], task: str, target: float, cap: int, auto: bool) -> dict:
    """Return the manifest's `controls` entry: the task the draws were seeded for, the rule, each control."""
    return {
        "task": task,
        "seeds": AUTO if auto else "fixed",
        "control_width": target if auto else None,
        "max_draws": cap if auto else None,
        "sets": [
            {
                "set": c.kind,
                "k": c.k,
                "draws": c.draws,
                "draw_width": None if math.isnan(c.width) else c.width,  # one draw: no spread to measure
                "stopped": c.stopped,
            }
            for c in found
        ],
    }
