"""Old import paths, kept for one release as one small shim file each (SciPy's way), and their allow-list.

A module that moved leaves a file at its old path holding two lines:

    from corelens.deprecation import moved
    __getattr__, __dir__ = moved(__name__)

Importing the old path warns (`CorelensDeprecationWarning`, a DeprecationWarning, naming the new path and the release that drops it) and
serves the new module's names, private ones included. `SHIMS` is the allow-list: a shim not on it is refused,
and `tests/test_layers.py` fails once the package's version reaches `REMOVED_IN`, so the shims cannot outlive
the release promised. A shim imports nothing from corelens at module level, so it adds no import edge.

Examples:
    >>> import warnings
    >>> from corelens.bench import ram_probe
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     getattr_, dir_ = moved("corelens.bench.ram")  # what the shim corelens/bench/ram.py runs
    >>> str(caught[0].message)
    'corelens.bench.ram is deprecated and goes in corelens 0.2.0; import corelens.bench.ram_probe'
    >>> getattr_("probe_sets") is ram_probe.probe_sets, "probe_sets" in dir_()
    (True, True)
    >>> moved("corelens.bench.nothing")
    Traceback (most recent call last):
    ...
    ImportError: corelens.bench.nothing is not on corelens.deprecation.SHIMS: add it there to keep an old path
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

REMOVED_IN = "0.2.0"  # the release that deletes every shim of SHIMS and every name that calls `deprecated`


class CorelensDeprecationWarning(DeprecationWarning):
    """corelens' own deprecations: the test suite makes them errors (pyproject's filterwarnings), so nothing
    inside the house uses a name that goes; a user's code sees an ordinary DeprecationWarning."""


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that `old` goes in release `REMOVED_IN` and that `new` replaces it (stacklevel 3: the caller of
    the function that calls this)."""
    warnings.warn(
        f"{old} is deprecated and goes in corelens {REMOVED_IN}; use {new}",
        CorelensDeprecationWarning,
        stacklevel,
    )


# {old import path: new import path}; each old path is a file whose whole body calls `moved`.
SHIMS = {
    "corelens.attention.hybrid": "corelens.attention.streaming",
    "corelens.bench.flow": "corelens.bench.flow_metrics",
    "corelens.bench.hybrid": "corelens.bench.hybrid_kernels",
    "corelens.bench.ram": "corelens.bench.ram_probe",
    "corelens.experiments.explorer": "corelens.report.explorer",
    "corelens.experiments.omega": "corelens.capture.omega",
    "corelens.experiments.overlay": "corelens.report.overlay",
    "corelens.metrics.importance": "corelens.metrics.causal_effects",
    "corelens.metrics.stability": "corelens.metrics.rank_agreement",
    "corelens.models.internvl": "corelens.models.families.internvl.tokens",
    "corelens.models.llava": "corelens.models.families.llava.tokens",
    "corelens.models.llava_next": "corelens.models.families.llava_next.tokens",
    "corelens.models.llava_onevision": "corelens.models.families.llava_onevision.tokens",
    "corelens.models.qwen_vl": "corelens.models.families.qwen2_vl.tokens",
    "corelens.models.registry": "corelens.models.families.family",
    "corelens.organism.model": "corelens.organism.architecture",
    "corelens.report.hybrid": "corelens.report.curves",
    "corelens.report.importance": "corelens.report.ram_vs_causal",
    "corelens.report.topology": "corelens.report.run_comparison",
    "corelens.report.uncertainty": "corelens.report.curves",
    "corelens.runs.jsonfile": "corelens.data.jsonfile",
}


def moved(old: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """Warn that module `old` moved; return the `__getattr__` and `__dir__` that serve the new module's names.

    Called from the shim's body, so the warning points (stacklevel 3) past the shim to the importing frame
    where Python's import machinery allows it. A path that is not on the allow-list is refused: a new shim
    is added to `SHIMS`, where the expiry test sees it.
    """
    if old not in SHIMS:
        raise ImportError(f"{old} is not on corelens.deprecation.SHIMS: add it there to keep an old path")
    new = SHIMS[old]
    warnings.warn(
        f"{old} is deprecated and goes in corelens {REMOVED_IN}; import {new}",
        DeprecationWarning,
        stacklevel=3,
    )
    module = importlib.import_module(new)

    def __getattr__(name: str) -> object:
        return getattr(module, name)

    def __dir__() -> list[str]:
        return dir(module)

    return __getattr__, __dir__
