"""The model organism: synthetic tasks (and, later, the trained checkpoint)."""
