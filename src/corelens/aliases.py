"""The old import paths of modules that issue 30 moved or renamed, kept for one release (they go in the next).

`import corelens.report.hybrid` (or `from corelens.report import hybrid`) gives `corelens.report.curves`
itself, with a DeprecationWarning naming the new path: its names, private ones included, and a patch of one of
them are the new module's. No file stands at an old path: `corelens/__init__.py` installs `MovedModules`, an
import finder consulted after the ordinary ones (so only for a path no file answers), which knows the old
paths of `MOVED`. A file at the old path would be a second module of that name, which `tests/test_layers.py`
refuses (no two modules of one name in different layers).

The modules `corelens.models.families` absorbed into a part of a new module (`corelens.models.qwen_vl`...) keep
their own alias files (`corelens.models.moved`): they serve the names of that part; `corelens.models.registry`,
all of `corelens.models.families.family`, is served here.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

# {old import path: new import path}
MOVED = {
    "corelens.attention.hybrid": "corelens.attention.streaming",
    "corelens.bench.flow": "corelens.bench.flow_metrics",
    "corelens.bench.hybrid": "corelens.bench.hybrid_kernels",
    "corelens.bench.ram": "corelens.bench.ram_probe",
    "corelens.experiments.explorer": "corelens.report.explorer",
    "corelens.experiments.overlay": "corelens.report.overlay",
    "corelens.metrics.importance": "corelens.metrics.causal_effects",
    "corelens.metrics.stability": "corelens.metrics.rank_agreement",
    "corelens.models.registry": "corelens.models.families.family",
    "corelens.organism.model": "corelens.organism.architecture",
    "corelens.report.hybrid": "corelens.report.curves",
    "corelens.report.importance": "corelens.report.ram_vs_causal",
    "corelens.report.topology": "corelens.report.run_comparison",
    "corelens.report.uncertainty": "corelens.report.curves",
}


class MovedModules:
    """The import finder and loader of `MOVED`'s old paths: each loads as its new module itself."""

    @staticmethod
    def find_spec(name: str, path=None, target=None) -> ModuleSpec | None:
        if name not in MOVED:
            return None  # not an old path: the ordinary finders answered it or nothing does
        return ModuleSpec(name, MovedModules)

    @staticmethod
    def create_module(spec: ModuleSpec) -> ModuleType:
        """Import and return the new module, warning that the old path goes (stacklevel: the importer)."""
        warnings.warn(
            f"{spec.name} is deprecated; import {MOVED[spec.name]}", DeprecationWarning, stacklevel=2
        )
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # importlib sets `__spec__` to the old path's: restored below
        return module

    @staticmethod
    def exec_module(module: ModuleType) -> None:
        """Run nothing (the new module has run); give it back its own `__spec__`."""
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Put `MovedModules` last on `sys.meta_path` (once)."""
    if MovedModules not in sys.meta_path:
        sys.meta_path.append(MovedModules)
