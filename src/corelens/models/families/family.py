"""`Family`: everything corelens knows about one transformers `model_type`, and the registry that holds them.

Generic code (loading, prompt preparation, tiny checkpoints, the SAP priors) asks the registry instead of
comparing model types. The registry is the one registry idiom (`corelens.registry.Registry`, shaped like
transformers' `GeneralInterface`): a mapping, filled by `FamilyInterface.register`. Each family is one
package of `corelens/models/families/` (its layout inside it), which imports them all: adding a family is
adding one package there (docs/extending/family.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace

from corelens.errors import UnsupportedModelError
from corelens.registry import Registry


def video_as_given(frame_times: list[float] | None, fps: float | None) -> dict:
    """Return the processor arguments of a video whose frames corelens sampled itself: no resampling.

    corelens samples the frames (the sample's `fps` / `max_frames`), so the processor must take them as
    given (`do_sample_frames=False`); a processor that resamples would drop frames the layout counts.
    """
    return {"videos_kwargs": {"do_sample_frames": False}} if frame_times else {}


def released_video_processor(video_processor_class: str) -> Callable:
    """Return image processor -> a transformers `video_processor_class` with the image processor's size and
    normalisation (for a published checkpoint that ships no video processor)."""

    def build(image_processor):
        import transformers

        return getattr(transformers, video_processor_class)(
            size=image_processor.size,
            image_mean=image_processor.image_mean,
            image_std=image_processor.image_std,
        )

    return build


@dataclass(frozen=True)
class Family:
    """One supported model type: its transformers classes, prompt layout, processor quirks and tiny checkpoint."""

    model_type: str  # config.json's `model_type`
    # transformers class names (resolved by `classes()`): the config, what `AutoModelForImageTextToText`
    # builds from it, and the processor.
    config_class: str
    model_class: str
    processor_class: str
    # (m, inputs, images, frames, frame_times, sample id) -> Layout: where the visual tokens of one processed
    # prompt sit and which pixels each covers (docs/methods.md#layout).
    layout: Callable
    # m -> [(name, the processor's value, the vision tower's value)]: token geometry both must agree on.
    geometry: Callable
    # Tiny checkpoints of the real classes (`corelens.models.tiny`): words -> word-level tokenizer with the
    # family's special tokens and chat template; (tokenizer, hidden=, layers=, heads=, kv_heads=, head_dim=,
    # intermediate=, vision_depth=) -> config; (tokenizer, **options) -> the family's processor.
    tiny_tokenizer: Callable
    tiny_config: Callable
    tiny_processor: Callable
    # The config fields that decide where visual tokens sit ("vision_config.patch_size", "image_seq_length"):
    # tiny checkpoints of a released checkpoint copy them from its config.json (`build_released_checkpoint`).
    released_geometry: tuple[str, ...]
    # Video: (frame_times, fps) -> extra processor arguments; image processor -> video processor, for a
    # published checkpoint without `video_preprocessor_config.json`. None: the family takes images only.
    processor_kwargs: Callable | None = video_as_given
    released_video_processor: Callable | None = None
    nested_images: bool = False  # the processor reads one prompt's images as a nested list
    # "module.function" of the vision tower's rotary embedding, for recomputing its last block's attention
    # (the SAP `vis_attn` prior); None: the family has no such prior.
    vision_rotary: str | None = None
    # What the docs and the generated tests read: the family's name in prose ("Qwen2-VL"); what its layout
    # follows (docs/families.md's table); the released checkpoint whose published processor files and vision
    # geometry are kept in tests/data/configs/<released>/ (layouts and the Ω oracle run on it); the pixels
    # per visual-token cell on that geometry (where the oracle's token boundaries fall).
    title: str = ""
    layout_notes: str = ""
    released: str | None = None
    cell_pixels: int = 0

    @classmethod
    def of(cls, model_type: str, classes: str, **fields) -> Family:
        """Return the family of `model_type` whose transformers classes are `<classes>Config`,
        `<classes>ForConditionalGeneration` and `<classes>Processor` (every supported family's naming)."""
        return cls(**_names(model_type, classes), **fields)

    def sibling(self, model_type: str, classes: str, **changes) -> Family:
        """Return a family built on this one: its own model type and classes (as `of`), `changes` to the rest."""
        return replace(self, **_names(model_type, classes), **changes)

    @property
    def video(self) -> bool:
        """Return whether the family takes a video."""
        return self.processor_kwargs is not None

    def classes(self) -> tuple[type, type, type]:
        """Return the (config, model, processor) classes from transformers."""
        import transformers

        return tuple(
            getattr(transformers, n) for n in (self.config_class, self.model_class, self.processor_class)
        )

    def rotary(self) -> Callable:
        """Return the vision tower's rotary embedding function (`vision_rotary`)."""
        module, _, name = self.vision_rotary.rpartition(".")
        return getattr(importlib.import_module(module), name)


FIELDS = tuple(f.name for f in fields(Family))


def family_table(families: Mapping[str, Family]) -> str:
    """Return docs/families.md's table of the supported families (generated from the registry)."""
    rows = [
        "| family (`model_type`) | layout vs processor | released configuration (layouts, Ω oracle) "
        "| RAM = eager (1e-5) | stock logits | ablation | hybrid | flow / SAP |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in families:
        f = families[name]
        logits = "✓ (images, video)" if f.video else "✓ (images)"
        sap = "✓" if f.vision_rotary else "✓ (SAP: no `vis_attn`)"
        rows.append(
            f"| {f.title} (`{name}`) | ✓ {f.layout_notes} | {f.released} | ✓ | {logits} | ✓ | ✓ | {sap} |"
        )
    return "\n".join(rows) + "\n"


def family_list(families: Mapping[str, Family]) -> str:
    """Return the README's list of supported families ("Qwen2-VL, ..., InternVL3"), in registry order."""
    return ", ".join(families[name].title for name in families)


def _names(model_type: str, classes: str) -> dict[str, str]:
    return {
        "model_type": model_type,
        "config_class": f"{classes}Config",
        "model_class": f"{classes}ForConditionalGeneration",
        "processor_class": f"{classes}Processor",
    }


def register(family: Family) -> Family:
    """Register `family` library-wide under its model type (`FamilyInterface.register`); return it."""
    return FamilyInterface.register(family)


class FamilyInterface(Registry):
    """model_type -> Family, library-wide through `register`, with local overrides per instance.

    The one registry idiom (`corelens.registry.Registry`, shaped like transformers' `GeneralInterface`):
    `FamilyInterface.register(family)` adds a family for every instance, named by its `model_type`;
    `interface[model_type] = family` overrides it in one instance only.
    """

    kind = "model_type"
    error = UnsupportedModelError

    @staticmethod
    def name_of(family: Family) -> str:
        return family.model_type
