"""The modules a family package absorbed stay importable for one release, each with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {
    "corelens.models.qwen_vl": ("corelens.models.families.qwen2_vl.tokens", "qwen_layout"),
    "corelens.models.llava": ("corelens.models.families.llava.tokens", "llava_layout"),
    "corelens.models.llava_next": ("corelens.models.families.llava_next.tokens", "llava_next_layout"),
    "corelens.models.llava_onevision": (
        "corelens.models.families.llava_onevision.tokens",
        "onevision_layout",
    ),
    "corelens.models.internvl": ("corelens.models.families.internvl.tokens", "internvl_layout"),
    "corelens.models.registry": ("corelens.models.families.family", "FamilyInterface"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_module_warns_and_serves_the_new_one(old, monkeypatch):
    new, name = MOVED[old]
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated and goes in corelens .*; import {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
