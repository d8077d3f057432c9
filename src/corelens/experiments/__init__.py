"""Experiments: a config in, a run directory out."""
