"""Statistics computed from records: RAM tables (and later spectra, mixing, stability)."""

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
