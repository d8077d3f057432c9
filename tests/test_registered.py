"""The names table the parsers read (`corelens.registered`, from the source) equals the registries (imported),
so an option's choices can be neither short of a registered name nor offer one that is not there."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from corelens import registered
from corelens.choices import KERNELS, OPS, PRIOR_NAMES, PRIORS


def _registries() -> dict[str, set[str]]:
    from corelens.attention.kernels.interface import KernelInterface
    from corelens.experiments.scorers import SCORERS
    from corelens.policies import POLICIES, PRIOR_CLASSES

    return {
        "policy": set(POLICIES),
        "head score": set(SCORERS),
        "hybrid kernel": set(KernelInterface()),
        "prior": set(PRIOR_CLASSES),
    }


@pytest.mark.parametrize("kind", sorted(registered.KINDS))
def test_each_table_equals_its_registry(kind):
    assert set(registered.names(kind)) == _registries()[kind]


def test_the_operators_are_the_registered_policies_on_a_set_of_heads():
    from corelens.policies import POLICIES, HeadsPolicy

    assert set(OPS) == {name for name, cls in POLICIES.items() if issubclass(cls, HeadsPolicy)}
    assert {"zero", "mean", "uniform", "knockout"} <= set(OPS) and "hybrid" not in OPS
    assert KERNELS[0] == "auto" and set(KERNELS[1:]) == _registries()["hybrid kernel"]
    assert set(PRIORS) < set(PRIOR_NAMES)  # the default sweep: registered priors


def test_a_new_registered_file_is_read_without_an_import(tmp_path, monkeypatch):
    """A policy file, a kernel and a prior written the three ways the registries are filled are found; a
    class without the decorator, or decorated with something else, is not."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "scale.py").write_text(
        textwrap.dedent(
            """
            from corelens.policies import HeadsPolicy, register

            class Base(HeadsPolicy):
                pass

            @register
            @dataclass(frozen=True)
            class ScaleHeads(Base):
                name: ClassVar[str] = "scale"

            @dataclass(frozen=True)
            class NotRegistered(HeadsPolicy):
                name: ClassVar[str] = "nope"

            @register_prior
            class Flat(Prior):
                name = "flat"
            """
        )
    )
    (tmp_path / "attention" / "kernels").mkdir(parents=True)
    (tmp_path / "attention" / "kernels" / "k.py").write_text('@kernel("fast")\ndef run(call):\n    pass\n')
    monkeypatch.setattr(registered, "PACKAGE", tmp_path)
    for cached in (registered.entries, registered._classes, registered._tree):
        monkeypatch.setattr(registered, cached.__name__, cached.__wrapped__)
    assert registered.names("policy") == ("scale",)
    assert registered.names("policy", base="HeadsPolicy") == ("scale",)  # through Base
    assert registered.names("policy", base="SessionPolicy") == ()
    assert registered.names("prior") == ("flat",)
    assert registered.names("hybrid kernel") == ("fast",)


def test_reading_the_names_imports_no_library():
    code = "import sys, corelens.choices; print(sorted(m for m in ('torch', 'numpy', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
