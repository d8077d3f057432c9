"""The family guide is true: its template, written as a toy family package, passes the family tests.

docs/extending/family.md's template becomes `corelens.models.families.toy_vl` in a temporary folder on the
families package's path (a package beside the shipped ones, found by the same discovery); the toy reuses
Qwen2-VL's transformers classes under its own `model_type`. The family tests then run on it unchanged:
its fields, its tiny builders, and a tiny checkpoint loaded by corelens, a sample prepared and one forward
(and greedy generation) under the registered attention equal to the stock model.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import test_families
import test_guides
import test_parity
import transformers
from transformers import AutoConfig, AutoModelForImageTextToText

from corelens.models import families
from corelens.models.families import FAMILIES, FamilyInterface

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending" / "family.md"


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
    code = (
        test_guides.template(GUIDE, "src/corelens/models/families/my_vl/__init__.py")
        .replace("my_vl", "toy_vl")
        .replace("MyVL", "ToyVL")
    )
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


@pytest.fixture
def toy_reader(tmp_path, monkeypatch):
    """Write the reader guide's template as `corelens.data.readers.toy_reader`, beside the shipped readers."""
    from corelens.data import readers
    from corelens.data.readers.common import ReaderInterface

    folder = tmp_path / "readers"
    folder.mkdir()
    code = test_guides.template(
        GUIDE.with_name("reader.md"), "src/corelens/data/readers/my_reader.py"
    ).replace("my_reader", "toy_reader")
    (folder / "toy_reader.py").write_text(code)
    monkeypatch.setattr(readers, "__path__", [*readers.__path__, str(folder)])
    try:
        yield "toy_reader"
    finally:
        ReaderInterface.unregister("toy_reader")
        sys.modules.pop("corelens.data.readers.toy_reader", None)


def test_toy_reader_from_template(toy_reader, tmp_path):
    from PIL import Image

    from corelens.data.readers import convert, readers
    from corelens.data.sample import read_samples
    from corelens.errors import InputError

    source = tmp_path / "source"
    source.mkdir()
    Image.new("RGB", (40, 30), "red").save(source / "a.png")
    items = [{"image": "a.png", "question": "what colour ?", "answer": "red", "box": [1, 2, 20, 25]}]
    (source / "questions.json").write_text(json.dumps(items))
    result = convert(f"{toy_reader}:{source}", tmp_path / "out")
    assert toy_reader in readers() and result.n == 1
    (sample,), _ = read_samples(result.path)
    assert (sample.question, sample.answer, sample.targets[0].box) == ("what colour ?", "red", (1, 2, 20, 25))
    (source / "questions.json").write_text(json.dumps([{"image": "a.png"}]))
    with pytest.raises(InputError, match="toy_reader-0.*field 'question'"):
        convert(f"{toy_reader}:{source}", tmp_path / "bad")


def test_toy_kernel_from_template(tmp_path, monkeypatch):
    """The kernel guide's template, registered under another name, runs through `prefill` and equals `reference`."""
    import importlib.util

    import torch

    from corelens.attention import kernels
    from corelens.choices import KERNELS

    assert set(KERNELS) - {"auto"} == set(kernels.IMPLEMENTATIONS), "choices.KERNELS is the kernel registry"
    code = test_guides.template(
        GUIDE.with_name("kernel.md"), "src/corelens/attention/kernels/my_kernel.py"
    ).replace("my_kernel", "toy_kernel")
    (tmp_path / "toy_kernel.py").write_text(code)
    spec = importlib.util.spec_from_file_location("toy_kernel", tmp_path / "toy_kernel.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    monkeypatch.setattr(kernels, "KERNELS", (*KERNELS, "toy_kernel"))
    try:
        torch.manual_seed(0)
        q, k, v = torch.randn(1, 4, 40, 8), torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8)
        full = torch.tensor([True, False, False, True])
        args = (q, k, v, None, full, kernels.Pattern(2, 8), 0.3)
        out, ran, _ = kernels.prefill("toy_kernel", *args)
        assert ran == "toy_kernel" and torch.allclose(out, kernels.reference(*args), atol=1e-6)
    finally:
        kernels.KernelInterface.unregister("toy_kernel")


@pytest.mark.parametrize("page", ["family.md", "reader.md", "kernel.md"])
def test_the_guides_are_linked_and_their_links_and_files_resolve(page):
    """docs/extending.md links each guide; each link and each `src/` / `tests/` file it names exists."""
    from test_docs import anchors, links

    guide = GUIDE.with_name(page)
    text = guide.read_text()
    assert f"extending/{page}" in links((ROOT / "docs" / "extending.md").read_text())
    for target in links(text):
        path, _, anchor = target.partition("#")
        assert (guide.parent / path).is_file(), target
        assert not anchor or anchor in anchors((guide.parent / path).read_text()), target
    named = re.findall(r"`((?:src|tests)/[\w/.]+\.(?:py|md))`", text)
    assert named and all((ROOT / n).is_file() for n in named if "<" not in n), named
