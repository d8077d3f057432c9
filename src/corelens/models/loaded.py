"""`load()`: a local checkpoint and its processor, with the text decoder on the corelens attention function."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from corelens.attention import NAME, register
from corelens.errors import CorelensError, UnsupportedModelError

SUPPORTED = {
    "qwen2_vl": "qwen_vl",
    "qwen2_5_vl": "qwen_vl",
    "qwen3_vl": "qwen_vl",
    "llava": "llava",
    "llava_next": "llava_next",
    "llava_onevision": "llava_onevision",
    "internvl": "internvl",
}


@dataclass
class Loaded:
    """A loaded model: the transformers model and processor plus what corelens needs to address heads."""

    model: torch.nn.Module
    processor: object
    path: Path
    model_type: str
    attention_layers: list[torch.nn.Module]  # decoder self-attention modules, in layer order

    @property
    def family(self) -> str:
        """Return the layout family of the model ("qwen_vl", "llava", "llava_next", "llava_onevision", "internvl")."""
        return SUPPORTED[self.model_type]

    @property
    def text_config(self):
        """Return the text decoder's config."""
        return self.model.config.get_text_config()

    @property
    def num_layers(self) -> int:
        """Return the number of decoder layers."""
        return len(self.attention_layers)

    @property
    def num_heads(self) -> int:
        """Return the number of query heads per decoder layer."""
        return self.text_config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        """Return the number of key/value heads per decoder layer."""
        return self.text_config.num_key_value_heads or self.num_heads

    @property
    def device(self) -> torch.device:
        """Return the device of the model's parameters."""
        return next(self.model.parameters()).device

    def layer_modules(self) -> list[tuple[int, torch.nn.Module]]:
        """Return (layer index, attention module) pairs, for hook activation."""
        return list(enumerate(self.attention_layers))

    def config_hash(self) -> str:
        """Return a short sha256 of the model config (recorded in run manifests)."""
        text = json.dumps(self.model.config.to_dict(), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


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


def load(
    path: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> Loaded:
    """Load a local VLM checkpoint + processor offline; its text decoder runs on the corelens attention."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CorelensError(f"{path}: not a checkpoint folder (no config.json)")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in SUPPORTED:
        raise UnsupportedModelError(
            f"{path}: model_type {config.model_type!r} is not supported; supported: {sorted(SUPPORTED)}"
        )
    register()
    model = AutoModelForImageTextToText.from_pretrained(
        path,
        local_files_only=True,
        dtype=dtype,
        attn_implementation={"": "sdpa", "text_config": NAME, "vision_config": "sdpa"},
    )
    model.to(device).eval()
    processor = AutoProcessor.from_pretrained(path, local_files_only=True)
    return Loaded(model, processor, path, config.model_type, decoder_attention_modules(model))
