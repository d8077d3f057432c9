"""Bounded JSON reading for run folders: the module lives in `corelens.data.jsonfile` (the dataset readers,
a layer below nothing that reads runs, share it); its names are served here too.

Examples:
    >>> from corelens.data import jsonfile as moved_here
    >>> load is moved_here.load
    True
"""

from corelens.data.jsonfile import DATASET_MAX_BYTES, MAX_BYTES, MAX_DEPTH, load, loads, parse

__all__ = ["DATASET_MAX_BYTES", "MAX_BYTES", "MAX_DEPTH", "load", "loads", "parse"]
