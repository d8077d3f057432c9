"""Statistics computed from records: RAM tables (and later spectra, mixing, stability)."""
