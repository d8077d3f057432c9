"""Where the corelens attention runs: the text decoder's self-attention modules of a transformers model."""

from __future__ import annotations

import torch

from corelens.errors import UnsupportedModelError


def decoder_attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Return the text decoder's self-attention modules in layer order (those driven by the text config)."""
    text_config = model.config.get_text_config()
    found = {}
    for module in model.modules():
        is_text = getattr(module, "config", None) is text_config and hasattr(module, "layer_idx")
        if is_text and hasattr(module, "q_proj") and hasattr(module, "o_proj"):
            found[module.layer_idx] = module
    if not found or sorted(found) != list(range(len(found))):
        raise UnsupportedModelError(f"could not find the decoder attention layers of {type(model).__name__}")
    return [found[i] for i in range(len(found))]
