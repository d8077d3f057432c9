"""The family guide is true: its template, written as a toy family package, passes the family tests.

docs/extending/family.md's template becomes `corelens.models.families.toy_vl` in a temporary folder on the
families package's path (a package beside the shipped ones, found by the same discovery); the toy reuses
Qwen2-VL's transformers classes under its own `model_type`. The family tests then run on it unchanged:
its fields, its tiny builders, and a tiny checkpoint loaded by corelens, a sample prepared and one forward
(and greedy generation) under the registered attention equal to the stock model.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import test_families
import test_parity
import transformers
from transformers import AutoConfig, AutoModelForImageTextToText

from corelens.models import families
from corelens.models.families import FAMILIES, FamilyInterface

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending" / "family.md"


def template(page: Path, marker: str) -> str:
    """Return the ```python block that follows `<!-- marker -->` on a docs page."""
    found = re.search(rf"<!-- {marker} -->\n```python\n(.*?)^```", page.read_text(), re.S | re.M)
    assert found, f"{page.name}: no python block after <!-- {marker} -->"
    return found.group(1)


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """Register `toy_vl` from the guide's template; transformers knows it as a Qwen2-VL under its own type."""

    class ToyVLConfig(transformers.Qwen2VLConfig):
        model_type = "toy_vl"

    class ToyVLForConditionalGeneration(transformers.Qwen2VLForConditionalGeneration):
        config_class = ToyVLConfig

    AutoConfig.register("toy_vl", ToyVLConfig, exist_ok=True)
    AutoModelForImageTextToText.register(ToyVLConfig, ToyVLForConditionalGeneration, exist_ok=True)
    for name, cls in (
        ("ToyVLConfig", ToyVLConfig),
        ("ToyVLForConditionalGeneration", ToyVLForConditionalGeneration),
        ("ToyVLProcessor", transformers.Qwen2VLProcessor),
    ):
        monkeypatch.setattr(transformers, name, cls, raising=False)
    package = tmp_path / "toy_vl"
    package.mkdir()
    code = template(GUIDE, "family template").replace("my_vl", "toy_vl").replace("MyVL", "ToyVL")
    (package / "__init__.py").write_text(code)
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    try:
        assert "toy_vl" in families.import_all()
        yield "toy_vl"
    finally:
        FamilyInterface.unregister("toy_vl")
        sys.modules.pop("corelens.models.families.toy_vl", None)


def test_toy_family_from_template(toy_family, tiny_dir, tmp_path):
    assert FAMILIES[toy_family].model_class == "ToyVLForConditionalGeneration"
    test_families.test_family_provides_every_field(toy_family)
    test_families.test_tiny_builders_give_the_family_classes(toy_family)
    test_parity.test_logits_equal_stock_sdpa(tiny_dir, toy_family, "one", tmp_path)
