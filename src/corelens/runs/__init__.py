"""Run directories and the one sample loop every experiment drives through them.

`rundir` holds the manifest and the resumable per-sample logs, `dist` the ranks of a torchrun launch, and
`driver` the loop (read -> resume -> shard -> step -> skip-bad -> log -> merge) that rank, ablate, hybrid, flow
and sap share.
"""

from corelens.runs.dist import Dist, current
from corelens.runs.rundir import (
    LOG,
    MANIFEST,
    Run,
    file_hash,
    machine,
    model_data_settings,
    versions,
    write_json,
)

__all__ = [
    "LOG",
    "MANIFEST",
    "Dist",
    "Run",
    "current",
    "file_hash",
    "machine",
    "model_data_settings",
    "versions",
    "write_json",
]
