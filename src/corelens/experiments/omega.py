"""Moved to `corelens.capture.omega`: this old path warns and serves it for one release (corelens.deprecation)."""

from corelens.deprecation import moved

__getattr__, __dir__ = moved(__name__)
