"""Loading checkpoints and, per family, turning samples into model inputs and a visual token layout."""

from corelens.attention.modules import decoder_attention_modules
from corelens.models.families import FAMILIES, Family, family_of
from corelens.models.loaded import SUPPORTED, Loaded, load

__all__ = ["FAMILIES", "SUPPORTED", "Family", "Loaded", "decoder_attention_modules", "family_of", "load"]
