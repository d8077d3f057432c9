"""Sample files: the interchange format, its strict reader and image / video loading."""

from corelens.data.sample import (
    DEFAULT_TASK,
    TARGET_KINDS,
    Box,
    Sample,
    SkippedSample,
    Target,
    Video,
    load_images,
    load_video,
    read_samples,
    sample_times,
    write_samples,
)

__all__ = [
    "DEFAULT_TASK",
    "TARGET_KINDS",
    "Box",
    "Sample",
    "SkippedSample",
    "Target",
    "Video",
    "load_images",
    "load_video",
    "read_samples",
    "sample_times",
    "write_samples",
]
