"""docs/extending/policy.md is true: its template, written as a toy policy in a package of its own, runs by
name through `corelens.answer` and the lmms-eval policy file, with no other file edited."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from test_guides import template

import corelens as cl
from corelens.data import read_samples
from corelens.models.prepare import prepare
from corelens.organism import organism_path
from corelens.organism.tasks import generate
from corelens.policies import Policy, PolicyInterface, ZeroHeads

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending" / "policy.md"
CORE = [(0, 5), (0, 6), (0, 7)]  # the organism's top 3 heads (docs: zeroing them changes the answer)


def _template() -> str:
    """Return the guide's template (the block it writes at `src/corelens/policies/scale.py`)."""
    return template(GUIDE, "src/corelens/policies/scale.py")


def test_toy_policy_from_template(tmp_path, monkeypatch):
    package = tmp_path / "toypolicies"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text(_template())
    monkeypatch.syspath_prepend(str(tmp_path))
    # The name free, as for a newcomer: the guide's file at its own path (tests/test_guides.py) registers it too.
    free = {k: v for k, v in PolicyInterface._global_mapping.items() if k != "scale"}
    monkeypatch.setattr(PolicyInterface, "_global_mapping", free)
    try:
        toy = importlib.import_module("toypolicies.scale")
        assert cl.POLICIES["scale"] is toy.ScaleHeads  # registered by importing its one file

        m = cl.load(organism_path(), device="cpu")
        samples, _ = read_samples(generate("image", tmp_path / "data", 1, seed=1))
        sample = samples[0]
        p = prepare(m, sample)
        scaled = Policy.from_dict({"name": "scale", "heads": CORE, "factor": 0.0})  # by name
        assert isinstance(scaled, toy.ScaleHeads) and Policy.from_json(scaled.to_json()) == scaled
        plain = cl.answer(m, p, None, max_new_tokens=2)
        zero = cl.answer(m, p, ZeroHeads(CORE), max_new_tokens=2)
        assert zero != plain  # the heads matter, so the check below can fail
        assert cl.answer(m, p, scaled, max_new_tokens=2) == zero  # factor 0 is zero ablation
        unit = Policy.from_dict({"name": "scale", "heads": CORE, "factor": 1.0})
        assert cl.answer(m, p, unit, max_new_tokens=2) == plain

        from corelens.integrations.lmms_eval.policy import answer_sample, policy_of

        path = tmp_path / "scale.json"
        path.write_text(scaled.to_json())
        chosen = policy_of(m, {"policy": str(path)})
        assert chosen == scaled
        assert answer_sample(m, sample, chosen, 2) == zero
    finally:
        for name in [n for n in sys.modules if n.startswith("toypolicies")]:
            del sys.modules[name]


def test_every_policy_module_registers_with_the_package():
    """The guide's "one file": `corelens.policies` imports every module of its folder."""
    import pkgutil

    import corelens.policies as policies

    for module in pkgutil.iter_modules(policies.__path__):
        assert f"corelens.policies.{module.name}" in sys.modules
    assert {"zero", "mean", "uniform", "knockout", "hybrid", "adaptive-hybrid", "sap"} <= set(cl.POLICIES)


def test_the_guide_lists_the_files_and_the_tests_that_check_it():
    text = GUIDE.read_text()
    assert "src/corelens/policies/NAME.py" in text and "tests/test_NAME.py" in text
    assert "test_extending.py" in text
    with pytest.raises(cl.OptionError, match="unknown policy 'nope'"):
        Policy.from_dict({"name": "nope"})
