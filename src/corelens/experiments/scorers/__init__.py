"""Head scorers: one small registered class per way of scoring heads (`corelens rank --score NAME`).

`SCORERS` maps each registered name to its class; `Scorer` is the base and its module docstring
(`corelens.experiments.scorers.base`) the contract every scorer keeps; `SampleScorer` is the base of the
scorers measured one sample at a time. A new scorer is one file in this folder (imported, so registered,
with the package) and its test; its settings are fields of `RankConfig` named like its own.

Examples:
    >>> from corelens.experiments.scorers import SCORERS, OutsideWindow, Scorer
    >>> {"ram", "retrieval", "outside-window", "causal"} <= set(SCORERS)
    True
    >>> OutsideWindow(sink="4", window="16").to_dict()
    {'name': 'outside-window', 'sink': '4', 'window': '16'}
    >>> Scorer.from_dict({"name": "retrieval", "all_answers": True})
    Retrieval(all_answers=True)
"""

from corelens.experiments.scorers.base import SCORERS, SampleScorer, ScoreJob, Scorer, register, scorer_of
from corelens.experiments.scorers.outside_window import OutsideWindow
from corelens.experiments.scorers.ram_mass import Ram
from corelens.experiments.scorers.retrieval import Retrieval
from corelens.experiments.scorers.single_head import Causal
from corelens.registry import import_modules as _import_modules

# Every module of this folder registers its scorers on import: a new file needs no line here.
_import_modules(__name__, __path__)

__all__ = [
    "SCORERS",
    "Causal",
    "OutsideWindow",
    "Ram",
    "Retrieval",
    "SampleScorer",
    "ScoreJob",
    "Scorer",
    "register",
    "scorer_of",
]
