"""Tiny checkpoints of the real VLM classes, any registered family: tokenizer, processor, random weights, offline.

Used by the tests (parity against the stock model) and by the model organism, which starts from one of
these and trains it. What differs per family (its config, tokenizer, processor) is the family's
(`corelens.models.families`); this module assembles them. Nothing here downloads anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, PreTrainedTokenizerFast

from corelens.models.families import FAMILIES, family_of

ALL_FAMILIES = tuple(FAMILIES)
IMAGE_FAMILIES = tuple(name for name in FAMILIES if not FAMILIES[name].video)  # images only
FAMILIES_WITH_VIDEO = tuple(name for name in FAMILIES if FAMILIES[name].video)


def tiny_tokenizer(family: str, words: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """Return the tiny word-level tokenizer of `family`, with its special tokens and chat template."""
    return family_of(family).tiny_tokenizer(words)


def tiny_config(
    family: str,
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    vision_depth: int = 1,
) -> object:
    """Return a small random-init config of the real `family` class wired to `tokenizer`'s special ids."""
    sizes = {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
    return family_of(family).tiny_config(
        tokenizer, intermediate=intermediate, vision_depth=vision_depth, **sizes
    )


def tiny_processor(family: str, tokenizer: PreTrainedTokenizerFast, **options):
    """Return the real processor class of `family` around `tokenizer`, with small tiles / pixel budgets.

    `options` go to the family's builder: Qwen-VL `min_pixels` / `max_pixels`, LLaVA `side` (and `pad` for
    LLaVA-1.5), InternVL `max_patches`.
    """
    return family_of(family).tiny_processor(tokenizer, **options)


def build_tiny_checkpoint(
    family: str,
    out: str | Path,
    *,
    words: Iterable[str] = (),
    seed: int = 0,
    processor_kwargs: dict | None = None,
    **config_kwargs,
) -> Path:
    """Write a random-init checkpoint of `family` with its tokenizer and processor to `out`; return `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(family, words)
    config = tiny_config(family, tokenizer, **config_kwargs)
    return _save(out, config, tiny_processor(family, tokenizer, **(processor_kwargs or {})), seed)


def _save(out: Path, config, processor, seed: int) -> Path:
    """Write a random-init model of `config` (weights drawn after seeding `seed`) and `processor` to `out`."""
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    model.eval()
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def load_tiny(path: str | Path, attn_implementation: str | dict = "sdpa"):
    """Load a checkpoint written by `build_tiny_checkpoint` with the stock Auto classes (fp32, eval)."""
    model = AutoModelForImageTextToText.from_pretrained(
        path, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval(), AutoProcessor.from_pretrained(path)


def _read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text()) if path.exists() else {}


def released_config(config_dir: str | Path, tokenizer: PreTrainedTokenizerFast, **config_kwargs) -> object:
    """Return a tiny config of the family of `config_dir/config.json` with its released vision geometry."""
    released = _read_json(Path(config_dir) / "config.json")
    family = family_of(released["model_type"])
    config = tiny_config(family.model_type, tokenizer, **config_kwargs)
    for key in family.released_geometry:
        owner, _, name = key.rpartition(".")
        source = released.get(owner, {}) if owner else released
        if name in source:
            setattr(getattr(config, owner) if owner else config, name, source[name])
    return config


def released_processor(config_dir: str | Path, tokenizer: PreTrainedTokenizerFast):
    """Return the family's processor built from the published processor files in `config_dir`.

    The image processor is loaded from `preprocessor_config.json` as published; the processor takes the
    published `processor_config.json` settings; a video processor comes from
    `video_preprocessor_config.json` where the checkpoint publishes one, else from the image settings.
    Only the tokenizer (and its chat template) is the tiny one.
    """
    from transformers import AutoImageProcessor

    config_dir = Path(config_dir)
    family = family_of(_read_json(config_dir / "config.json")["model_type"])
    image_processor = AutoImageProcessor.from_pretrained(config_dir)
    settings = {
        k: v for k, v in _read_json(config_dir / "processor_config.json").items() if k != "processor_class"
    }
    cls = family.classes()[2]
    template = tokenizer.chat_template
    if not family.video:
        return cls(image_processor, tokenizer, chat_template=template, **settings)
    if (config_dir / "video_preprocessor_config.json").exists():
        from transformers import AutoVideoProcessor

        video_processor = AutoVideoProcessor.from_pretrained(config_dir)
    else:
        video_processor = family.released_video_processor(image_processor)
    return cls(image_processor, tokenizer, video_processor, chat_template=template, **settings)


def build_released_checkpoint(
    config_dir: str | Path,
    out: str | Path,
    *,
    words: Iterable[str] = (),
    seed: int = 0,
    **config_kwargs,
) -> Path:
    """Write a random-init tiny checkpoint with a released checkpoint's vision geometry and processor files.

    `config_dir` holds the published `config.json` (at least `model_type` and the vision geometry),
    `preprocessor_config.json` and, where published, `processor_config.json` /
    `video_preprocessor_config.json`. Widths and depths stay tiny (`config_kwargs` as in `tiny_config`).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    family = _read_json(Path(config_dir) / "config.json")["model_type"]
    tokenizer = tiny_tokenizer(family, words)
    config = released_config(config_dir, tokenizer, **config_kwargs)
    return _save(out, config, released_processor(config_dir, tokenizer), seed)
