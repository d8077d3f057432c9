"""The names the registries hold, read from the source of the folders that fill them, without importing them.

A command's parser lists the registered policies, head scores, hybrid kernels and SAP priors as its choices,
and refuses an unknown one, in well under a second: importing the registries would import torch. So the
names are read here from the files that register them: a class decorated `@register` (or `@register_prior`)
with a `name = "..."` class attribute, or anything decorated `@kernel("...")`. A new registered file is found
by that alone; nothing else is edited. tests/test_registered.py checks each table equals its registry.

Examples:
    >>> from corelens.registered import names
    >>> names("policy")
    ('adaptive-hybrid', 'graded', 'hybrid', 'knockout', 'mean', 'sap', 'uniform', 'zero')
    >>> names("policy", base="HeadsPolicy")  # what ablates a set of heads: --op's choices
    ('knockout', 'mean', 'uniform', 'zero')
    >>> names("hybrid kernel")
    ('blocked', 'flex', 'partitioned', 'reference')
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parent

# kind -> (the folder that registers it, the decorators that do)
KINDS = {
    "policy": ("policies", ("register",)),
    "head score": ("experiments/scorers", ("register",)),
    "hybrid kernel": ("attention/kernels", ("kernel",)),
    "prior": ("policies", ("register_prior",)),
}


class Entry(NamedTuple):
    """One registered implementation as its source declares it."""

    name: str
    module: str  # its file's stem
    qualname: str  # the class or function's name
    bases: tuple[str, ...]  # a class' base classes, as written (last dotted part)


def _decorator(node: ast.expr) -> tuple[str, str | None]:
    """Return (the decorator's callee name, its first string argument or None)."""
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    callee = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    first = call.args[0] if call and call.args else None
    return callee, first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _class_name(node: ast.ClassDef) -> str | None:
    """Return the string a class body assigns to `name` (`name = "x"` or `name: ClassVar[str] = "x"`)."""
    for item in node.body:
        target = item.target if isinstance(item, ast.AnnAssign) else None
        if isinstance(item, ast.Assign) and len(item.targets) == 1:
            target = item.targets[0]
        value = getattr(item, "value", None)
        if getattr(target, "id", None) == "name" and isinstance(value, ast.Constant):
            return value.value if isinstance(value.value, str) else None
    return None


def _base(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


@functools.cache
def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(_text(path), filename=str(path))


@functools.cache
def _classes(folder: str) -> dict[str, tuple[str, ...]]:
    """Return every class of the folder's modules: name -> its bases' names."""
    out: dict[str, tuple[str, ...]] = {}
    for path in sorted((PACKAGE / folder).glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, tuple(_base(b) for b in node.bases))
    return out


@functools.cache
def entries(kind: str) -> tuple[Entry, ...]:
    """Return what the source of `kind`'s folder registers (`KINDS`), sorted by name."""
    folder, decorators = KINDS[kind]
    found = []
    for path in sorted((PACKAGE / folder).glob("*.py")):
        if not any(f"@{d}" in _text(path) for d in decorators):
            continue  # parsing is the cost: a file that never writes the decorator registers nothing
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            for callee, argument in map(_decorator, node.decorator_list):
                if callee not in decorators:
                    continue
                name = argument if argument is not None else None
                if name is None and isinstance(node, ast.ClassDef):
                    name = _class_name(node)
                if name:
                    bases = tuple(map(_base, node.bases)) if isinstance(node, ast.ClassDef) else ()
                    found.append(Entry(name, path.stem, node.name, bases))
    return tuple(sorted(found))


def _derives(qualname: str, base: str, classes: dict[str, tuple[str, ...]]) -> bool:
    """Return True when class `qualname` has `base` among its ancestors (within the folder's classes)."""
    todo, seen = [qualname], set()
    while todo:
        current = todo.pop()
        if current == base:
            return True
        if current not in seen:
            seen.add(current)
            todo.extend(classes.get(current, ()))
    return False


def names(kind: str, *, base: str | None = None) -> tuple[str, ...]:
    """Return the registered names of `kind`, sorted; with `base`, only the classes deriving from it."""
    found = entries(kind)
    if base is not None:
        classes = _classes(KINDS[kind][0])
        found = tuple(e for e in found if _derives(e.qualname, base, classes))
    return tuple(e.name for e in found)
