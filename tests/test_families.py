"""The family registry: every registered family provides every field, and they match the real classes.

That each family's tiny model loads and runs through corelens is checked where the tiny models are built
for every family anyway: `any_family` (tests/conftest.py) runs over `ALL_FAMILIES`, which is the registry,
so a new family runs through test_parity.py's `test_logits_equal_stock_sdpa` and
`test_probe_and_rows_on_every_family` (load, prepare, layout, probes) without a line here.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from transformers import AutoModelForImageTextToText

from corelens.errors import UnsupportedModelError
from corelens.models.families import FAMILIES, family_of
from corelens.models.families.family import FIELDS, Family, FamilyInterface
from corelens.models.tiny import ALL_FAMILIES, tiny_config, tiny_processor, tiny_tokenizer

REQUIRED = tuple(f.name for f in fields(Family) if f.default is MISSING)


def test_the_tests_run_every_registered_family():
    assert set(ALL_FAMILIES) == set(FAMILIES) and len(FAMILIES) >= 7


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_provides_every_field(name):
    family = FAMILIES[name]
    assert family.model_type == name
    assert set(FIELDS) == {f.name for f in fields(family)}
    for field in fields(Family):
        value = getattr(family, field.name)
        if field.name in REQUIRED:
            assert value is not None and len(str(value)) > 2, f"{name}: {field.name} is not set"
        if field.type == "Callable" or (value is not None and "Callable" in field.type):
            assert callable(value), f"{name}: {field.name} is not callable"
    # A family that takes a video says how to process one and how to build a published one's video processor.
    assert family.video == (family.released_video_processor is not None), name
    if family.video:
        assert family.processor_kwargs([0.0, 0.5], 2.0)["videos_kwargs"]["do_sample_frames"] is False
        assert family.processor_kwargs([], None) == {}
    config_cls, model_cls, processor_cls = family.classes()
    assert (config_cls.model_type, model_cls.config_class) == (name, config_cls)
    if family.vision_rotary is not None:
        assert callable(family.rotary())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_tiny_builders_give_the_family_classes(name):
    family = FAMILIES[name]
    config_cls, model_cls, processor_cls = family.classes()
    tokenizer = tiny_tokenizer(name, ["cup"])
    config = tiny_config(name, tokenizer, layers=1, hidden=32, head_dim=8, intermediate=32)
    assert type(config) is config_cls
    assert AutoModelForImageTextToText._model_mapping[type(config)] is model_cls
    assert type(tiny_processor(name, tokenizer)) is processor_cls
    assert tokenizer.chat_template, f"{name}: the tiny tokenizer has no chat template"


@pytest.mark.parametrize("name", [n for n in sorted(FAMILIES) if FAMILIES[n].vision_rotary])
def test_vision_rotary_is_the_one_the_tower_applies(name):
    """`vision_rotary` is what the vision tower's attention module calls (what SAP's vis_attn recomputes)."""
    tokenizer = tiny_tokenizer(name)
    config = tiny_config(name, tokenizer, layers=1, hidden=32, head_dim=8, intermediate=32)
    model = AutoModelForImageTextToText.from_config(config)
    attn = next(m.blocks[-1].attn for n, m in model.named_modules() if n.endswith("visual"))
    assert sys.modules[type(attn).__module__].apply_rotary_pos_emb_vision is FAMILIES[name].rotary()


def test_registry_is_a_mapping_with_register_and_local_overrides():
    local = FamilyInterface()
    qwen = FAMILIES["qwen2_vl"]
    local["qwen2_vl"] = mine = Family(**{f: getattr(qwen, f) for f in FIELDS} | {"nested_images": True})
    assert local["qwen2_vl"] is mine and FAMILIES["qwen2_vl"] is qwen  # local to that instance
    del local["qwen2_vl"]
    assert local["qwen2_vl"] is qwen and len(local) == len(FAMILIES)
    with pytest.raises(UnsupportedModelError, match="not supported; supported"):
        family_of("bert")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_released_geometry_names_config_fields(name):
    """Every `released_geometry` field exists in the family's config (a typo would copy nothing)."""
    config = tiny_config(name, tiny_tokenizer(name), layers=1)
    for key in FAMILIES[name].released_geometry:
        owner, _, field = key.rpartition(".")
        assert hasattr(getattr(config, owner) if owner else config, field), f"{name}: no config field {key}"


def test_the_docs_family_table_and_the_readme_list_are_the_registry():
    """docs/families.md's table and the README's list of families are generated from the registry."""
    from corelens.models.families.family import family_list, family_table

    root = Path(__file__).resolve().parents[1]
    table = family_table(FAMILIES)
    assert table in (root / "docs" / "families.md").read_text(), "paste family_table(FAMILIES):\n" + table
    readme = " ".join((root / "README.md").read_text().split())
    assert f"models ({family_list(FAMILIES)})." in readme, family_list(FAMILIES)
