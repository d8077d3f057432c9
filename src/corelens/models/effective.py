"""The settings a processor actually applies: its call-time defaults over its sub-processors' stored values.

A processor merges, for each call, the arguments given, its own class-level defaults (for example
`InternVLProcessor.images_kwargs = {"crop_to_patches": True}`) and the tokenizer's; the image processor
then fills whatever is still unset from its stored attributes. A stored attribute the processor overrides
(GOT-OCR2's `crop_to_patches = False` in converted InternVL checkpoints) is not what runs, so layouts read
the merged values through the processor's own merge (`ProcessorMixin._merge_kwargs`) rather than
re-implementing its precedence rules.
"""

from __future__ import annotations


def effective_kwargs(processor, modality: str = "images_kwargs", **call_kwargs) -> dict:
    """Return the settings `processor(..., **call_kwargs)` passes to its `modality` sub-processor, filled in
    with that sub-processor's stored attributes for every key the processor leaves unset (or None)."""
    sub = {"images_kwargs": "image_processor", "videos_kwargs": "video_processor"}[modality]
    stored = getattr(processor, sub, None)
    merged: dict = {}
    merge = getattr(processor, "_merge_kwargs", None)
    if merge is not None:
        tokenizer = getattr(processor, "tokenizer", None)
        merged = merge(
            processor.valid_processor_kwargs,
            tokenizer_init_kwargs=getattr(tokenizer, "init_kwargs", None),
            **call_kwargs,
        ).get(modality, {})
    keys = set(merged) | set(getattr(getattr(stored, "valid_kwargs", None), "__annotations__", {}))
    out = {}
    for key in keys:
        value = merged.get(key)
        out[key] = value if value is not None else getattr(stored, key, None)
    return out


def effective_images_kwargs(processor, **call_kwargs) -> dict:
    """Return the image settings `processor` applies (see `effective_kwargs`)."""
    return effective_kwargs(processor, "images_kwargs", **call_kwargs)
