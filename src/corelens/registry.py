"""One registry idiom: a mapping from a name to an implementation, filled by a `register` decorator.

Shaped like transformers' `GeneralInterface` (the `AttentionInterface` corelens registers its attention
function in): a subclass of `Registry` is one kind of thing (model families, hybrid kernels, dataset
readers, ...). `Kind.register` adds an entry for every instance (library-wide); `instance[name] = impl`
overrides it in that instance only, without touching the others. A name that is not there is refused with
the subclass' `error`, naming the known names:

    class Greeters(Registry):
        kind = "greeter"

    @Greeters.register("hello")
    def hello(name): return f"hello {name}"

    Greeters()["hello"]("you")  # 'hello you'
    Greeters()["bye"]           # OptionError: unknown greeter 'bye'; known: hello

An implementation registered without a name is named by the kind's `name_of` (default: its `__name__`;
a `Family` is named by its `model_type`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, ClassVar

from corelens.errors import CorelensError, OptionError


class Registry(MutableMapping):
    """name -> implementation; library-wide through `register`, with local overrides per instance."""

    kind: ClassVar[str] = "entry"  # what an entry is, in the refusal ("unknown hybrid kernel 'x'")
    error: ClassVar[type[CorelensError]] = OptionError  # what a missing name raises
    _global_mapping: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        # Each kind (a direct subclass) has its own library-wide mapping; a subclass of a kind shares it.
        super().__init_subclass__(**kwargs)
        if Registry in cls.__bases__:
            cls._global_mapping = {}

    @staticmethod
    def name_of(impl: Any) -> str:
        """Return the name of an implementation registered without one (a kind may say where it is)."""
        return impl.__name__

    def __init__(self) -> None:
        self._local_mapping: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name in self._local_mapping:
            return self._local_mapping[name]
        if name in self._global_mapping:
            return self._global_mapping[name]
        raise self.error(f"unknown {self.kind} {name!r}; known: {', '.join(self) or 'none'}")

    def __contains__(self, name: object) -> bool:  # without the refusal: `in` is a question, not a lookup
        return name in self._local_mapping or name in self._global_mapping

    def get(self, name: str, default: Any = None) -> Any:
        return self._local_mapping.get(name, self._global_mapping.get(name, default))

    def __setitem__(self, name: str, impl: Any) -> None:
        self._local_mapping[name] = impl

    def __delitem__(self, name: str) -> None:
        del self._local_mapping[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._global_mapping.keys() | self._local_mapping.keys()))

    def __len__(self) -> int:
        return len(self._global_mapping.keys() | self._local_mapping.keys())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)})"

    @classmethod
    def register(cls, impl_or_name: Any = None, /) -> Any:
        """Register an implementation for every instance; usable three ways, each returning the implementation.

        `@Kind.register("name")` (a decorator with a name), `@Kind.register` / `Kind.register(impl)` (the name
        from `name_of`, or the function's `__name__` where the kind has no `name_of`).
        """
        if isinstance(impl_or_name, str):
            name = impl_or_name
            return lambda impl: cls._add(name, impl)
        return cls._add(cls.name_of(impl_or_name), impl_or_name)

    @classmethod
    def _add(cls, name: str, impl: Any) -> Any:
        cls._global_mapping[name] = impl
        return impl

    @classmethod
    def unregister(cls, name: str) -> None:
        """Remove a library-wide entry (a test's temporary registration)."""
        cls._global_mapping.pop(name, None)


def import_modules(package: str, path: Iterable[str], *, packages_only: bool = False) -> list[str]:
    """Import every module (or, with `packages_only`, every sub-package) of `package` found on `path` (its
    `__path__`), so that each registers what it defines: a new file in a registry's folder needs no line in
    its `__init__.py`. Return their names."""
    names = [m.name for m in pkgutil.iter_modules(path) if m.ispkg or not packages_only]
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


def refuse_unknown_fields(cls: type, data: Mapping, what: str, noun: str = "field") -> None:
    """Refuse, in one line naming `what`, the keys of `data` that are not init fields of the dataclass `cls`
    (a `from_dict` reading a registered class' `to_dict` data)."""
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise OptionError(f"{what}: unknown {noun}(s) {unknown}; expected some of {sorted(known)}")


class NamedClasses:
    """A registry of classes, each under its `name` class attribute (a mixin: `class Kinds(NamedClasses,
    Registry)`, so that the kind keeps a mapping of its own). Refused at registration, in one line: a class
    without a `name`; an abstract class (it could not be built from its name); a second class under a name
    taken (the later would silently replace the other everywhere; the same class defined again, as a
    reloaded module does, replaces itself)."""

    @staticmethod
    def name_of(impl: type) -> str:
        if not getattr(impl, "name", None):
            raise OptionError(f"{impl.__name__} has no `name` to register it under")
        return impl.name

    @classmethod
    def _add(cls, name: str, impl: type) -> type:
        if inspect.isabstract(impl):
            missing = ", ".join(sorted(impl.__abstractmethods__))
            raise OptionError(
                f"{cls.kind} {name!r} ({impl.__name__}) is abstract: it does not define {missing}"
            )
        existing = cls._global_mapping.get(name)
        if existing is not None and (existing.__module__, existing.__qualname__) != (
            impl.__module__,
            impl.__qualname__,
        ):
            raise OptionError(f"{cls.kind} {name!r} is registered already ({existing.__module__})")
        return super()._add(name, impl)
