"""A package's public names imported from their module on first use (PEP 562), from one table.

`import corelens` and the command line's parser then do not pay for torch and transformers; each package
declares {name: module} and gets its module `__getattr__` from `lazy_names`.

Examples:
    >>> import types
    >>> pkg = types.ModuleType("pkg")
    >>> pkg.__getattr__ = lazy_names("pkg", {"dedent": "textwrap"}, vars(pkg))
    >>> pkg.dedent("  x"), "dedent" in vars(pkg)  # imported once, then a plain lookup
    ('x', True)
    >>> pkg.indent
    Traceback (most recent call last):
    ...
    AttributeError: module 'pkg' has no attribute 'indent'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_names(package: str, table: Mapping[str, str], namespace: dict) -> Callable[[str], Any]:
    """Return the module `__getattr__` of `package` serving the names of `table` ({name: module}): each is
    imported on first use and kept in `namespace` (the package's `globals()`), so later uses are plain lookups."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
