"""Loading checkpoints and, per family, turning samples into model inputs and a visual token layout."""

from corelens.models.loaded import SUPPORTED, Loaded, decoder_attention_modules, load

__all__ = ["SUPPORTED", "Loaded", "decoder_attention_modules", "load"]
