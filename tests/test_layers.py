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

from corelens.deprecation import SHIMS

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
    # capture: what a forward of a loaded model is read for (residual states, attention maps, causal Omega),
    #   read by experiments; report draws it.
    # organism: a trained tiny model (architecture, training, checkpoint) and its synthetic tasks; its
    #   evaluation and card are experiments (experiments/organism_eval.py, organism_card.py).
    ("attention", "models", "report", "heads", "capture", "organism"),
    ("layout",),
    ("data", "metrics", "runs"),
    # choices: the values options choose from and their defaults, read by every parser; registered: the
    # registries' names read from their source (no import), which choices lists.
    # registry: the one registry idiom (name -> implementation) of families, kernels, readers, policies.
    # deprecation: the allow-list of old import paths (one shim file at each) and the helper each calls.
    # lazy: the module `__getattr__` that imports a package's public names on first use (PEP 562).
    # experiment_registry: each experiment command declared once (its command, config, outputs), read by the
    #   command line before any import and by runs (OUTPUTS).
    ("errors", "choices", "registered", "registry", "deprecation", "lazy", "experiment_registry"),
)
RANK = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}

# Import cycles between the modules of one package allowed for now, each written as the modules in import
# order (the last imports the first). None: issue 30 removed the last five (attention adaptive / hybrid /
# schema, heads artifact / card / schema, the readers package); a new one fails the test below.
KNOWN_CYCLES: set[tuple[str, ...]] = set()

# Old import paths of moved modules: a shim file at each (corelens.deprecation), whose whole body calls
# `moved`; it imports nothing at module level, so no rule below sees it as a module of its own.
SHIM_BODY = "from corelens.deprecation import moved\n\n__getattr__, __dir__ = moved(__name__)\n"


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


def _stem(module: str) -> str:
    return module.rsplit(".", 1)[-1]


def misleading_namesakes(src: Path = SRC) -> list[str]:
    """Return the imports where one name stands for modules of different layers, the only clash that misleads:
    a module importing a namesake of its own from another layer (`experiments/tokens.py` importing a family's
    `tokens`), or importing two modules of one name from different layers (`from corelens.models import
    tokens` beside `from corelens.metrics import tokens`).

    Namesakes that never meet in one file (a guide's `policies/scale.py` beside `bench/scale.py`) pass;
    a package's `__init__` / `__main__` is named by its package.
    """
    found = []
    for module, targets in sorted(module_imports(src).items()):
        named = [t for t in targets if _stem(t) not in ("__init__", "__main__") and t.count(".") > 1]
        for target in sorted(named):
            if _stem(target) == _stem(module) and RANK[_unit(target)] != RANK[_unit(module)]:
                found.append(f"{module} imports its namesake {target}")
        stems: dict[str, list[str]] = {}
        for target in named:
            stems.setdefault(_stem(target), []).append(target)
        across = [ts for ts in stems.values() if len({RANK[_unit(t)] for t in ts}) > 1]
        found += [f"{module} imports {' and '.join(sorted(ts))}" for ts in across]
    return found


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


def test_no_import_where_one_name_stands_for_two_modules():
    found = misleading_namesakes()
    assert not found, "rename one of the modules these imports confuse:\n" + "\n".join(found)


def _shim_paths(src: Path = SRC) -> list[str]:
    """Return the dotted paths of the shim files below `src` (their whole body calls `moved`)."""
    return sorted(
        ".".join(p.relative_to(src.parent).with_suffix("").parts)
        for p in src.rglob("*.py")
        if SHIM_BODY in p.read_text()
    )


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_a_moved_module_keeps_its_old_import_path_for_one_release(old, monkeypatch):
    """`import` of the old path warns (DeprecationWarning, naming the new path and the release that drops it)
    and serves the new module's names, private ones included; `from package import old` works too."""
    from corelens.deprecation import REMOVED_IN

    new = importlib.import_module(SHIMS[old])
    monkeypatch.delitem(sys.modules, old, raising=False)
    match = f"{old} is deprecated and goes in corelens {REMOVED_IN}; import {SHIMS[old]}"
    with pytest.warns(DeprecationWarning, match=match.replace(".", r"\.")):
        alias = importlib.import_module(old)
    names = [n for n in vars(new) if not n.startswith("__")]
    assert names and all(getattr(alias, n) is getattr(new, n) for n in names)
    assert set(names) <= set(dir(alias))
    package, _, name = old.rpartition(".")
    monkeypatch.delattr(importlib.import_module(package), name, raising=False)
    monkeypatch.delitem(sys.modules, old)
    with pytest.warns(DeprecationWarning):
        assert getattr(__import__(package, fromlist=[name]), name).__name__ == old


def test_the_shims_are_the_allow_list_and_expire():
    """Every shim file is on the allow-list and every entry has its file (one shape, so a shim is two lines);
    the list expires: this fails once the package's version reaches the release that drops the shims."""
    from packaging.version import Version

    from corelens import __version__
    from corelens.deprecation import REMOVED_IN

    assert _shim_paths() == sorted(SHIMS)
    assert all(not _exists(new, SRC) or new not in SHIMS for new in SHIMS.values())
    assert Version(__version__) < Version(REMOVED_IN), f"release {REMOVED_IN}: delete the shims and SHIMS"


def test_a_namesake_import_is_found_and_namesakes_apart_pass(tmp_path):
    """The name rule fails when it should: a module importing its namesake of another layer, and one importing
    two modules of one name; two namesakes that no file imports together pass."""
    pkg = tmp_path / "corelens"
    for name in ("experiments", "policies", "bench", "models", "metrics"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "tokens.py").write_text("")
    (pkg / "metrics" / "tokens.py").write_text("")
    (pkg / "experiments" / "tokens.py").write_text("from corelens.models import tokens\n")
    (pkg / "experiments" / "both.py").write_text(
        "from corelens.models import tokens\nfrom corelens.metrics import tokens as t2\n"
    )
    (pkg / "policies" / "scale.py").write_text("")
    (pkg / "bench" / "scale.py").write_text("")
    assert misleading_namesakes(pkg) == [
        "corelens.experiments.both imports corelens.metrics.tokens and corelens.models.tokens",
        "corelens.experiments.tokens imports its namesake corelens.models.tokens",
    ]


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


def test_the_module_walk_sees_lazy_cycles(tmp_path):
    """A cycle of two modules of one package through a function-level import is found, one whose back edge
    is only for type checking is not."""
    pkg = tmp_path / "corelens"
    for name in ("attention", "heads"):
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
    edges = module_edges(pkg)
    assert edges == {
        ("corelens.attention", "corelens.attention.hybrid"),
        ("corelens.attention.hybrid", "corelens.attention.adaptive"),
        ("corelens.attention.adaptive", "corelens.attention.hybrid"),
        ("corelens.heads.artifact", "corelens.heads.card"),
    }
    assert _cycles(edges) == [["corelens.attention.adaptive", "corelens.attention.hybrid"]]
