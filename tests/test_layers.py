"""The package's import layers: no import from a lower layer to a higher one, no cycle between packages.

Every `import corelens...` in src/corelens counts, at module level or inside a function (a lazy import is
still a dependency); only `if TYPE_CHECKING:` blocks are skipped (annotations, never run). A unit is a
top-level package (`corelens.models`) or a top-level module (`corelens.cli`, `corelens/__init__.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

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
    ("errors", "choices"),
)
RANK = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    """Return the layer unit of a dotted module name inside corelens."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


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
            if name == "corelens":  # `from corelens import models` names a unit, `__version__` the root
                yield from (f"corelens.{a.name}" if (src / a.name).exists() else name for a in node.names)
            else:
                yield name
        stack.extend(ast.iter_child_nodes(node))


def import_edges(src: Path = SRC) -> dict[tuple[str, str], list[str]]:
    """Return {(importing unit, imported unit): ["corelens.a.b imports corelens.c", ...]} across units."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        for target in _imports(ast.parse(path.read_text(), str(path)), module, is_package, src):
            a, b = _unit(module), _unit(target)
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} imports {target}")
    return edges


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


def module_edges(src: Path = SRC, units: tuple[str, ...] = ("attention", "policies")) -> dict:
    """Return {(module, imported module): [why]} between the modules of `units` (lazy imports included)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        is_package = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        if _unit(module) not in units or is_package:
            continue
        for target in _imports(ast.parse(path.read_text(), str(path)), module, is_package, src):
            if target != module and (src.parent / Path(*target.split("."))).with_suffix(".py").is_file():
                edges.setdefault((module, target), []).append(f"{module} imports {target}")
    return edges


def test_no_cycle_between_the_modules_of_attention_and_policies():
    """attention/hybrid.py and attention/adaptive.py imported each other (inside a function): no more."""
    cycles = _cycles(module_edges())
    assert not cycles, f"import cycles between modules: {cycles}"
