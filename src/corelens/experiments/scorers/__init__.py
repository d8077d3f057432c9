"""Head scorers: one small registered class per way of scoring heads (`corelens rank --score NAME`).

`SCORERS` maps each registered name to its class; `Scorer` is the base and its module docstring
(`corelens.experiments.scorers.base`) the contract every scorer keeps; `SampleScorer` is the base of the
scorers measured one sample at a time. A new scorer is one file in this folder (imported, so registered,
with the package) and its test; its settings are fields of `RankConfig` named like its own.

Examples:
    >>> from corelens.experiments.scorers import SCORERS, Scorer
    >>> "ram" in SCORERS
    True
    >>> Scorer.from_dict({"name": "ram"}).to_dict()
    {'name': 'ram'}
"""

import importlib as _importlib
import pkgutil as _pkgutil

from corelens.experiments.scorers.base import SCORERS, SampleScorer, ScoreJob, Scorer, register, scorer_of

# Every module of this folder registers its scorers on import: a new file needs no line here.
for _module in _pkgutil.iter_modules(__path__):
    _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SCORERS", "SampleScorer", "ScoreJob", "Scorer", "register", "scorer_of"]
