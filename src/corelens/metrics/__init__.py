"""Statistics computed from records: RAM tables (and later spectra, mixing, stability).

The names below are imported from their module on first use (PEP 562): a command line that only reads the
constants of `corelens.metrics.kvheads` (its parser) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corelens.lazy import lazy_names

_EXPORTS = {
    **dict.fromkeys(("mixig", "row_entropies", "tme"), "corelens.metrics.mixing"),
    **dict.fromkeys(
        (
            "Rid",
            "RidTerms",
            "Spectrum",
            "erank",
            "kept_rank",
            "rid",
            "rid_terms",
            "singular_values",
            "spectrum",
        ),
        "corelens.metrics.spectra",
    ),
}
__all__ = [
    "Rid",
    "RidTerms",
    "Spectrum",
    "erank",
    "kept_rank",
    "mixig",
    "rid",
    "rid_terms",
    "row_entropies",
    "singular_values",
    "spectrum",
    "tme",
]

if TYPE_CHECKING:
    from corelens.metrics.mixing import mixig, row_entropies, tme
    from corelens.metrics.spectra import (
        Rid,
        RidTerms,
        Spectrum,
        erank,
        kept_rank,
        rid,
        rid_terms,
        singular_values,
        spectrum,
    )


__getattr__ = lazy_names(__name__, _EXPORTS, globals())
