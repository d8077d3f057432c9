"""The organism's architecture: a small Qwen2.5-VL (the real transformers class) with its own tokenizer.

The text decoder has 4 layers x 8 query heads (2 key/value heads, as in Qwen2.5-VL's GQA), the vision
tower 2 blocks (one windowed, one full), both far smaller than any released model, so training from
scratch fits on two CPU cores. Visual tokens are 28 x 28 pixels, as in every Qwen2.5-VL.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForImageTextToText

from corelens.errors import CorelensError, OptionError
from corelens.models.tiny import tiny_config, tiny_processor
from corelens.models.tiny_parts import build_tokenizer
from corelens.organism.tasks import WORDS

FAMILY = "qwen2_5_vl"
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 224 * 224  # larger images are scaled down to at most 64 visual tokens


@dataclass(frozen=True)
class OrganismConfig:
    """Sizes of the organism (text decoder and vision tower)."""

    hidden: int = 128
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 384
    vision_depth: int = 2
    vision_hidden: int = 64
    vision_heads: int = 4
    vision_intermediate: int = 128
    window_size: int = 112
    init_std: float = 0.08  # std of the normal initialisation of every weight matrix

    def __post_init__(self) -> None:
        # Qwen2.5-VL's text attention derives its head size from hidden / heads; rope sections from head_dim.
        if self.heads * self.head_dim != self.hidden or self.heads % self.kv_heads:
            raise OptionError(
                f"organism sizes: need heads x head_dim = hidden and kv_heads dividing heads, got heads "
                f"{self.heads}, head_dim {self.head_dim}, hidden {self.hidden}, kv_heads {self.kv_heads}"
            )

    @classmethod
    def sized(cls, *, layers: int, heads: int, hidden: int) -> OrganismConfig:
        """Return the default organism resized: head_dim = hidden / heads, MLP = 3 x hidden."""
        if hidden % heads:
            raise CorelensError(f"--hidden {hidden} is not a multiple of --heads {heads}")
        return cls(
            layers=layers, heads=heads, hidden=hidden, head_dim=hidden // heads, intermediate=3 * hidden
        )

    def to_dict(self) -> dict:
        """Return the sizes as a plain dict."""
        return asdict(self)


def build_processor(min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS):
    """Return the organism's processor: Qwen2.5-VL's processor around the organism's word-level tokenizer."""
    tokenizer = build_tokenizer(WORDS)
    return tiny_processor(FAMILY, tokenizer, min_pixels=min_pixels, max_pixels=max_pixels)


def build_model(cfg: OrganismConfig, processor, seed: int = 0) -> torch.nn.Module:
    """Return a randomly initialised Qwen2.5-VL of sizes `cfg`, wired to `processor`'s tokenizer."""
    config = tiny_config(
        FAMILY,
        processor.tokenizer,
        hidden=cfg.hidden,
        layers=cfg.layers,
        heads=cfg.heads,
        kv_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        intermediate=cfg.intermediate,
        vision_depth=cfg.vision_depth,
    )
    vision = config.vision_config
    vision.hidden_size = cfg.vision_hidden
    vision.num_heads = cfg.vision_heads
    vision.intermediate_size = cfg.vision_intermediate
    vision.window_size = cfg.window_size
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
