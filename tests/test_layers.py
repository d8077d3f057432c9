"""The package's import layers: no import from a lower layer to a higher one, no cycle between packages, no
cycle between the modules of one package, no two modules of one name in different layers.

Every `import corelens...` in src/corelens counts, at module level or inside a function (a lazy import is
still a dependency); only `if TYPE_CHECKING:` blocks are skipped (annotations, never run). A unit is a
top-level package (`corelens.models`) or a top-level module (`corelens.cli`, `corelens/__init__.py`).
`from corelens.a import b` names the module `corelens.a.b` where there is one, else `corelens.a` (its
`__init__.py`); the parent packages that Python runs first do not count as imported (every submodule would
otherwise import its package's `__init__.py`, which often imports it back).
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "corelens"

# Top to bottom; a unit may import its own layer (without a cycle) and any layer below it.
LAYERS = (
    # Entry points: `python -m corelens`, and the public API (`import corelens`), which re-exports from
    # every layer below, so nothing inside the package may import it.
    ("__main__", "__init__"),
    ("cli",),
    # integrations: adapters that other tools import (lmms-eval, kvpress); like commands they drive
    # experiments and nothing in corelens imports them.
    ("commands", "integrations"),
    # bench: the measurements behind `corelens bench` (kernels, models, the organism), experiments of their own.
    ("experiments", "bench"),
    # policies: what is applied while answering (one registered class per intervention) and the one
    # `answer` under a policy, used by experiments, integrations and the Python API.
    ("policies",),
    # The middle: attention (the registered attention function), models (loading registers it), report.
    # heads: the head-set artifact (records the model it came from, via models.hub).
    # capture: hooks on a loaded model's decoder layers, read by experiments.
    # organism: a trained tiny model (architecture, training, checkpoint) and its synthetic tasks; its
    #   evaluation and card are experiments (experiments/organism_eval.py, organism_card.py).
    ("attention", "models", "report", "heads", "capture", "organism"),
    ("layout",),
    ("data", "metrics", "runs"),
    # choices: the values options choose from and their defaults; imports nothing, read by every parser.
    # registry: the one registry idiom (name -> implementation) of families, kernels, readers, policies.
    # aliases: the old import paths of moved modules (an import finder that `corelens/__init__.py` installs).
    ("errors", "choices", "registry", "aliases"),
)
RANK = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}

# Import cycles between the modules of one package allowed for now, each written as the modules in import
# order (the last imports the first). None: issue 30 removed the last five (attention adaptive / hybrid /
# schema, heads artifact / card / schema, the readers package); a new one fails the test below.
KNOWN_CYCLES: set[tuple[str, ...]] = set()

# Modules moved or renamed by issue 30, kept for one release at their old import path as deprecation aliases
# (importing the old path gives the new module itself): {old: new}. No file stands at an old path: the import
# finder of `corelens.aliases` serves them from its table `MOVED`, which must be this one (so each alias is
# tested below). They go in the next release, and with them this table.
ALIASES = {
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

# Modules that share their name with a module of another layer today (paths below src/corelens). A new one
# fails the test; one renamed away must leave this set (test_the_known_lists_are_current).
KNOWN_SAME_NAMES: set[str] = set()


def _unit(module: str) -> str:
    """Return the layer unit of a dotted module name inside corelens."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _exists(module: str, src: Path) -> bool:
    """Return whether the dotted `module` is a module or package of the tree rooted at `src` (corelens)."""
    path = src.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(tree: ast.AST, module: str, is_package: bool, src: Path):
    """Yield the corelens modules `tree` imports, skipping `if TYPE_CHECKING:` bodies (not their `else`)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "corelens")
        elif isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                name = ".".join([*base, *([name] if name else [])])
            if name.split(".")[0] != "corelens":
                continue
            # `from corelens import models` names a unit, `from corelens.a import b` the module a.b where there
            # is one; a name defined in the package (`__version__`, `activate`) names its `__init__.py`.
            yield from (f"{name}.{a.name}" if _exists(f"{name}.{a.name}", src) else name for a in node.names)
        stack.extend(ast.iter_child_nodes(node))


def _module(name: str, src: Path) -> str:
    """Return the longest prefix of the dotted `name` that is a module of the tree (an imported module)."""
    parts = name.split(".")
    while len(parts) > 1 and not _exists(".".join(parts), src):
        parts.pop()
    return ".".join(parts)


@functools.cache
def module_imports(src: Path = SRC) -> dict[str, set[str]]:
    """Return {module: the corelens modules it imports} for every module of the tree rooted at `src`."""
    graph: dict[str, set[str]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = {_module(t, src) for t in _imports(tree, module, is_package, src)} - {module}
    return graph


def import_edges(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """Return {(importing unit, imported unit): ["corelens.a.b imports corelens.c", ...]} across units."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in module_imports(src).items():
        for target in sorted(targets):
            a, b = _unit(module), _unit(target)
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} imports {target}")
    return edges


def module_edges(src: Path = SRC) -> set[tuple[str, str]]:
    """Return the (importing module, imported module) pairs inside one unit."""
    return {(a, b) for a, targets in module_imports(src).items() for b in targets if _unit(a) == _unit(b)}


def same_names(src: Path = SRC) -> dict[str, list[str]]:
    """Return {module name: its paths below `src`} for the names that modules of different layers share.

    A package's `__init__.py` and `__main__.py` are named by their package: they do not count.
    """
    by_name: dict[str, list[Path]] = {}
    for path in sorted(src.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            by_name.setdefault(path.stem, []).append(path.relative_to(src))
    out = {}
    for name, paths in sorted(by_name.items()):
        rank = {RANK[_unit(".".join(("corelens", *p.with_suffix("").parts)))] for p in paths}
        if len(rank) > 1:
            out[name] = [p.as_posix() for p in paths]
    return out


def _cycles(edges) -> list[list[str]]:
    """Return the strongly connected components of more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_unit_has_a_layer():
    units = {_unit(".".join(p.relative_to(SRC.parent).with_suffix("").parts)) for p in SRC.rglob("*.py")}
    units |= {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert sorted(units - set(RANK)) == [], "place every new package or module in LAYERS"


def test_no_import_goes_up_a_layer():
    upward = [
        f"{a} -> {b}: {', '.join(sorted(set(why)))}"
        for (a, b), why in sorted(import_edges().items())
        if RANK[b] < RANK[a]
    ]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_cycle_between_packages():
    edges = import_edges()
    cycles = [
        f"{' <-> '.join(c)}: "
        + "; ".join(w for (a, b), why in edges.items() if a in c and b in c for w in why)
        for c in _cycles(edges)
    ]
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def _cycle_edges(cycle: tuple[str, ...]) -> set[tuple[str, str]]:
    """Return the imports of a cycle written as its modules in import order (the last imports the first)."""
    return set(zip(cycle, cycle[1:] + cycle[:1]))


def test_no_cycle_between_the_modules_of_a_package():
    """No cycle, short or long, once the imports of the cycles in KNOWN_CYCLES are set aside."""
    edges = module_edges() - {e for cycle in KNOWN_CYCLES for e in _cycle_edges(cycle)}
    cycles = [
        " <-> ".join(c) + ": " + "; ".join(f"{a} imports {b}" for a, b in sorted(edges) if {a, b} <= set(c))
        for c in _cycles(edges)
    ]
    assert not cycles, "import cycles between the modules of one package:\n" + "\n".join(cycles)


def test_no_two_modules_of_one_name_in_different_layers():
    new = sorted({p for paths in same_names().values() for p in paths} - KNOWN_SAME_NAMES)
    assert not new, f"modules named like a module of another layer (rename them): {new}"


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_a_moved_module_keeps_its_old_import_path_for_one_release(old, monkeypatch):
    """`import` of the old path warns (DeprecationWarning) and gives the new module itself, so that its names,
    private ones included, and a patch of one of them are the new module's."""
    new = importlib.import_module(ALIASES[old])
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=ALIASES[old].replace(".", r"\.")):
        alias = importlib.import_module(old)
    assert alias is new and sys.modules[old] is new
    assert new.__spec__.name == ALIASES[old]  # still the new module's own spec (reload, pickling, -m)
    package, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(package), name) is new  # `from corelens.bench import ram`


def test_the_aliases_are_served_by_the_finder_not_by_files():
    """Every old path is in the finder's table (so tested above), and none is a file: a file there would be a
    module of its own, named like a module of another layer."""
    from corelens.aliases import MOVED

    assert MOVED == ALIASES
    assert [old for old in ALIASES if _exists(old, SRC)] == []
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("corelens.report.no_such_module")  # the finder answers only its old paths


def test_the_known_lists_are_current():
    """A cycle removed or a module renamed leaves KNOWN_CYCLES / KNOWN_SAME_NAMES, so neither can come back."""
    gone = [cycle for cycle in sorted(KNOWN_CYCLES) if not _cycle_edges(cycle) <= module_edges()]
    assert gone == [], "gone: remove them from KNOWN_CYCLES"
    named = {p for paths in same_names().values() for p in paths}
    assert sorted(KNOWN_SAME_NAMES - named) == [], "gone: remove them from KNOWN_SAME_NAMES"


def test_the_walk_sees_lazy_imports_and_skips_type_checking(tmp_path):
    """The checks fail when they should: a lazy upward import and a cycle of peers are both found."""
    pkg = tmp_path / "corelens"
    for name in ("data", "models", "attention"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "stats.py").write_text("def f():\n    from corelens.models.loaded import Loaded\n")
    (pkg / "models" / "loaded.py").write_text("from corelens.attention import register\n")
    (pkg / "attention" / "hybrid.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from corelens.data import x\n"
        "def g():\n    from .. import models\n"
    )
    edges = import_edges(pkg)
    assert set(edges) == {("data", "models"), ("models", "attention"), ("attention", "models")}
    assert _cycles(edges) == [["attention", "models"]]


def test_the_module_walk_sees_lazy_cycles_and_same_names(tmp_path):
    """A cycle of two modules of one package through a function-level import is found, one whose back edge
    is only for type checking is not; a module named like one of another layer is found."""
    pkg = tmp_path / "corelens"
    for name in ("attention", "heads", "metrics"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text(
            "from corelens.attention import hybrid\n" * (name == "attention")
        )
    (pkg / "__init__.py").write_text("")
    (pkg / "attention" / "hybrid.py").write_text("def f():\n    from corelens.attention.adaptive import g\n")
    (pkg / "attention" / "adaptive.py").write_text("from corelens.attention import hybrid\n")
    (pkg / "heads" / "card.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from corelens.heads.artifact import H\n"
    )
    (pkg / "heads" / "artifact.py").write_text("def f():\n    from . import card\n")
    (pkg / "metrics" / "card.py").write_text("")
    edges = module_edges(pkg)
    assert edges == {
        ("corelens.attention", "corelens.attention.hybrid"),
        ("corelens.attention.hybrid", "corelens.attention.adaptive"),
        ("corelens.attention.adaptive", "corelens.attention.hybrid"),
        ("corelens.heads.artifact", "corelens.heads.card"),
    }
    assert _cycles(edges) == [["corelens.attention.adaptive", "corelens.attention.hybrid"]]
    assert same_names(pkg) == {"card": ["heads/card.py", "metrics/card.py"]}
