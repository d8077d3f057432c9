"""The registry idiom (`corelens.registry.Registry`): library-wide entries, local overrides, named refusals."""

from __future__ import annotations

import pytest

from corelens.errors import OptionError, UnsupportedModelError
from corelens.registry import Registry


class Greeters(Registry):
    kind = "greeter"


class Parts(Registry):
    kind = "part"
    error = UnsupportedModelError

    @staticmethod
    def name_of(impl) -> str:
        return impl["id"]


@Greeters.register("hello")
def hello(name: str) -> str:
    return f"hello {name}"


@Greeters.register
def bye(name: str) -> str:
    return f"bye {name}"


def test_register_by_name_by_function_name_and_by_name_of():
    assert Greeters()["hello"]("you") == "hello you"
    assert Greeters()["bye"] is bye
    part = Parts.register({"id": "wheel"})
    assert Parts()["wheel"] is part
    assert list(Greeters()) == ["bye", "hello"] and list(Parts()) == ["wheel"]  # one mapping per kind


def test_a_missing_name_is_refused_naming_the_known_ones():
    with pytest.raises(OptionError, match=r"unknown greeter 'hi'; known: bye, hello"):
        Greeters()["hi"]
    with pytest.raises(UnsupportedModelError, match="unknown part 'tyre'; known: wheel"):
        Parts()["tyre"]
    assert "hi" not in Greeters() and "hello" in Greeters() and Greeters().get("hi") is None


def test_a_local_override_touches_one_instance_only():
    mine, other = Greeters(), Greeters()
    mine["hello"] = bye
    mine["extra"] = hello
    assert mine["hello"] is bye and other["hello"] is hello
    assert "extra" in mine and "extra" not in other and len(mine) == 3 and len(other) == 2
    del mine["hello"]
    assert mine["hello"] is hello


def test_unregister_removes_a_library_wide_entry():
    Greeters.register("temporary")(hello)
    assert "temporary" in Greeters()
    Greeters.unregister("temporary")
    assert "temporary" not in Greeters()
