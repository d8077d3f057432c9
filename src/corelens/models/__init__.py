"""Loading checkpoints and, per family, turning samples into model inputs and a visual token layout.

The names below are imported on first use (PEP 562), as `corelens`' own: `corelens.models.hub` (resolving a
hub id before the model loads) is then importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corelens.lazy import lazy_names

_EXPORTS = {
    "decoder_attention_modules": "corelens.attention.modules",
    "FAMILIES": "corelens.models.families",
    "Family": "corelens.models.families",
    "family_of": "corelens.models.families",
    "SUPPORTED": "corelens.models.loaded",
    "Loaded": "corelens.models.loaded",
    "load": "corelens.models.loaded",
}
__all__ = ["FAMILIES", "SUPPORTED", "Family", "Loaded", "decoder_attention_modules", "family_of", "load"]

if TYPE_CHECKING:
    from corelens.attention.modules import decoder_attention_modules
    from corelens.models.families import FAMILIES, Family, family_of
    from corelens.models.loaded import SUPPORTED, Loaded, load


__getattr__ = lazy_names(__name__, _EXPORTS, globals())
