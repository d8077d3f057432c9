"""Shared fixtures: tiny random-init checkpoints of the real VLM classes, built once per session."""

from __future__ import annotations

import os

# Triton kernels run on CPU tensors only under Triton's interpreter, chosen when triton is first imported: set it
# before anything imports triton (tests/test_stream_kernel.py; nothing here runs Triton on a GPU).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch

from corelens.models.families import FAMILIES as REGISTRY
from corelens.models.families.qwen2_vl import qwen_layout_of
from corelens.models.tiny import ALL_FAMILIES, IMAGE_FAMILIES, build_tiny_checkpoint

# The families laid out by the Qwen-VL layout (grids from the processor, images and video).
FAMILIES = tuple(name for name in ALL_FAMILIES if REGISTRY[name].layout is qwen_layout_of)

# One thread per pytest-xdist worker (`make test` and `make check` run one worker per core: a second thread per
# worker only competes with the other worker); two for a run without workers.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Return a function family -> folder of a tiny checkpoint (GQA: 4 query heads over 2 KV heads)."""
    made: dict[tuple, object] = {}

    def get(family: str, **config):
        key = (family, tuple(sorted(config.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny-{family}")
            made[key] = build_tiny_checkpoint(family, out, words=["cup", "red", "blue"], **config)
        return made[key]

    return get


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    """Each supported Qwen-VL family in turn (images and video)."""
    return request.param


@pytest.fixture(params=ALL_FAMILIES)
def any_family(request) -> str:
    """Every supported family in turn, LLaVA included (image tests)."""
    return request.param


def skip_video(family: str, kind: str) -> None:
    """Skip a video case for a family that takes images only."""
    if kind == "video" and family in IMAGE_FAMILIES:
        pytest.skip(f"{family} takes images only")
