"""The organism's architecture: a small Qwen2.5-VL (the real transformers class) with its own tokenizer.

The text decoder has 4 layers x 8 query heads (2 key/value heads, as in Qwen2.5-VL's GQA), the vision
tower 2 blocks (one windowed, one full), both far smaller than any released model, so training from
scratch fits on two CPU cores. Visual tokens are 28 x 28 pixels, as in every Qwen2.5-VL.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForImageTextToText

from corelens.models.tiny import tiny_config, tiny_processor
from corelens.models.tiny_parts import build_tokenizer
from corelens.organism.config import OrganismConfig
from corelens.organism.tasks import WORDS

FAMILY = "qwen2_5_vl"
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 224 * 224  # larger images are scaled down to at most 64 visual tokens

# Where the sizes of an `OrganismConfig` go: these reach `tiny_config` as its keywords of the same names; the
# vision tower's are set on its `vision_config`, {attribute: OrganismConfig field}.
TEXT_SIZES = ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vision_depth")
VISION_SIZES = {
    "hidden_size": "vision_hidden",
    "num_heads": "vision_heads",
    "intermediate_size": "vision_intermediate",
    "window_size": "window_size",
}


def build_processor(min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS):
    """Return the organism's processor: Qwen2.5-VL's processor around the organism's word-level tokenizer."""
    tokenizer = build_tokenizer(WORDS)
    return tiny_processor(FAMILY, tokenizer, min_pixels=min_pixels, max_pixels=max_pixels)


def build_model(cfg: OrganismConfig, processor, seed: int = 0) -> torch.nn.Module:
    """Return a randomly initialised Qwen2.5-VL of sizes `cfg`, wired to `processor`'s tokenizer."""
    config = tiny_config(FAMILY, processor.tokenizer, **{name: getattr(cfg, name) for name in TEXT_SIZES})
    vision = config.vision_config
    for attribute, name in VISION_SIZES.items():
        setattr(vision, attribute, getattr(cfg, name))
    for part in (config, config.get_text_config(), vision):
        part.initializer_range = cfg.init_std
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    generation = model.generation_config
    generation.do_sample = False
    generation.eos_token_id = config.eos_token_id
    generation.pad_token_id = config.pad_token_id
    generation.bos_token_id = None
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Return the number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
