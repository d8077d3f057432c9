"""Tiny checkpoints of the real VLM classes (Qwen-VL, LLaVA): tokenizer, processor, random weights, offline.

Used by the tests (parity against the stock model) and by the model organism, which starts from one of
these and trains it. Nothing here downloads anything.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, PreTrainedTokenizerFast

from corelens.errors import OptionError

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")  # image + video
IMAGE_FAMILIES = ("llava", "llava_next")  # images only
ALL_FAMILIES = (*FAMILIES, *IMAGE_FAMILIES, "llava_onevision", "internvl")
LLAVA_FAMILIES = ("llava", "llava_next", "llava_onevision")
LLAVA_IMAGE_TOKEN = "<image>"
LLAVA_VIDEO_TOKEN = "<video>"

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "[UNK]",
)

# The Qwen-VL chat template, reduced to what corelens prompts use: one or more turns whose content is a
# string or a list of image / video / text parts. Visual parts render exactly as in the released templates.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

INTERNVL_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
INTERNVL_TILE = 112
# InternVL3's template: Qwen-style turns; an image is `<IMG_CONTEXT>` (the processor expands it to
# `<img>` + tiles + `</img>`), a video `<video>` (expanded to `FrameN: <img>...</img>` per frame).
INTERNVL_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|vision_start|><|image_pad|><|vision_end|>", "<IMG_CONTEXT>\n"
).replace("<|vision_start|><|video_pad|><|vision_end|>", "<video>\n")

# LLaVA-1.5's conversation format ("USER: <image>\n... ASSISTANT:"), with the tiny tokenizer's end token.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'video' %}<video>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% if message['role'] == 'user' %} {% else %}<|im_end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

BASE_WORDS = (
    "user assistant system seconds what which is the a an of in on at to and or colour color shape size "
    "object left right above below top bottom first last page block frame video image document answer yes no"
).split()


def build_tokenizer(
    words: Iterable[str] = (),
    extra_special: tuple[str, ...] = (),
    chat_template: str = CHAT_TEMPLATE,
    named: dict[str, str] | None = None,
) -> PreTrainedTokenizerFast:
    """Return a word-level fast tokenizer with the Qwen-VL special tokens (+ `extra_special`), digits, punctuation."""
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *string.digits, *string.punctuation, *BASE_WORDS, *words, *extra_special):
        vocab.setdefault(token, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.normalizer = normalizers.Lowercase()
    # Splits words, digits one by one and each punctuation mark, so timestamps like "<1.5 seconds>" tokenize.
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Whitespace(),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ]
    )
    core.decoder = decoders.WordPiece(prefix="##")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="[UNK]",
        pad_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=[*SPECIAL_TOKENS[1:7], *extra_special],
        chat_template=chat_template,
        padding_side="left",
        **({"model_specific_special_tokens": named} if named else {}),
    )
    return tokenizer


def _vision_config(family: str, text_hidden: int, depth: int) -> dict:
    if family == "qwen2_vl":
        return {
            "depth": depth,
            "embed_dim": 32,
            "hidden_size": text_hidden,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
        }
    if family == "qwen2_5_vl":
        return {
            "depth": depth,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": text_hidden,
            "patch_size": 14,
            "window_size": 112,
            "fullatt_block_indexes": [depth - 1],
        }
    if family == "qwen3_vl":
        return {
            "depth": depth,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": text_hidden,
            "patch_size": 16,
            "num_position_embeddings": 256,
            "deepstack_visual_indexes": [depth - 1],
        }
    raise OptionError(f"unknown family {family!r}; expected one of {FAMILIES}")


def tiny_config(
    family: str,
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    vision_depth: int = 1,
) -> object:
    """Return a small random-init config of the real `family` class wired to `tokenizer`'s special ids."""
    if family in LLAVA_FAMILIES:
        return _llava_config(
            family, tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate, vision_depth
        )
    if family == "internvl":
        return _internvl_config(
            tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate, vision_depth
        )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    half = head_dim // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    if family == "qwen3_vl":
        rope["mrope_interleaved"] = True
    text = _qwen2_text(tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate)
    text.pop("model_type")
    text |= {"max_position_embeddings": 32768, "rope_parameters": rope, "bos_token_id": None}
    config = AutoConfig.for_model(
        family,
        text_config=text,
        vision_config=_vision_config(family, hidden, vision_depth),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=True,
    )
    return config


# LLaVA-NeXT's any-res resolutions, scaled to the tiny 56-pixel tiles (the released models use 336).
TINY_PINPOINTS = [[56, 112], [112, 56], [112, 112], [56, 168], [168, 56]]
TINY_ASPECT = "anyres_max_2"  # OneVision downsamples grids above 2 tiles' worth of features (a 2 x 2 grid)


def _qwen2_text(tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate) -> dict:
    """Return the Qwen2 text-decoder config of the LLaVA / InternVL tiny checkpoints."""
    return {
        "model_type": "qwen2",
        "vocab_size": len(tokenizer),
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "tie_word_embeddings": True,
    }


def _llava_config(
    family, tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate, vision_depth
) -> object:
    """Return a LLaVA-1.5 / NeXT config: a CLIP vision tower (56 px tiles), a projector, a Qwen2 decoder."""
    ids = {
        t: tokenizer.convert_tokens_to_ids(t) for t in (*SPECIAL_TOKENS, LLAVA_IMAGE_TOKEN, LLAVA_VIDEO_TOKEN)
    }
    text = _qwen2_text(tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate)
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": max(2, vision_depth),
        "num_attention_heads": 2,
        "image_size": 56,
        "patch_size": 14,
        "projection_dim": 32,
    }
    extra: dict = {"image_grid_pinpoints": TINY_PINPOINTS} if family != "llava" else {}
    if family == "llava_onevision":  # SigLIP tower, all features, video token
        vision = {k: v for k, v in vision.items() if k != "projection_dim"} | {
            "model_type": "siglip_vision_model"
        }
        extra |= {
            "video_token_id": ids[LLAVA_VIDEO_TOKEN],
            "vision_feature_select_strategy": "full",
            "vision_feature_layer": -1,
            "vision_aspect_ratio": TINY_ASPECT,
        }
    return AutoConfig.for_model(
        family,
        text_config=text,
        vision_config=vision,
        image_token_id=ids[LLAVA_IMAGE_TOKEN],
        **{"vision_feature_layer": -2, "vision_feature_select_strategy": "default"} | extra,
        projector_hidden_act="gelu",
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        tie_word_embeddings=True,
    )


def _llava_processor(family: str, tokenizer, *, side: int = 56, pad: bool = False):
    """Return LLaVA-1.5's (CLIP recipe: shortest edge -> `side`, centre crop) or LLaVA-NeXT's processor."""
    common = {"size": {"shortest_edge": side}, "crop_size": {"height": side, "width": side}}
    if family == "llava_onevision":
        from transformers.models.llava_onevision import (
            LlavaOnevisionImageProcessor,
            LlavaOnevisionProcessor,
            LlavaOnevisionVideoProcessor,
        )

        square = {"height": side, "width": side}
        return LlavaOnevisionProcessor(
            LlavaOnevisionImageProcessor(size=square, image_grid_pinpoints=TINY_PINPOINTS),
            tokenizer,
            LlavaOnevisionVideoProcessor(size=square),
            num_image_tokens=(side // 14) ** 2,
            vision_feature_select_strategy="full",
            vision_aspect_ratio=TINY_ASPECT,
            image_token=LLAVA_IMAGE_TOKEN,
            video_token=LLAVA_VIDEO_TOKEN,
            chat_template=LLAVA_CHAT_TEMPLATE,
        )
    if family == "llava_next":
        from transformers.models.llava_next import LlavaNextImageProcessor, LlavaNextProcessor

        image_processor = LlavaNextImageProcessor(**common, image_grid_pinpoints=TINY_PINPOINTS)
        cls = LlavaNextProcessor
    else:
        from transformers.models.llava import LlavaImageProcessor, LlavaProcessor

        image_processor = LlavaImageProcessor(**common, do_pad=pad)
        cls = LlavaProcessor
    return cls(
        image_processor,
        tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token=LLAVA_IMAGE_TOKEN,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )


def _internvl_config(
    tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate, vision_depth
) -> object:
    """Return an InternVL3 config: an InternViT tower (112 px tiles, 16 tokens each), a Qwen2 decoder."""
    vision = {
        "model_type": "internvl_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": vision_depth,
        "num_attention_heads": 2,
        "image_size": [INTERNVL_TILE, INTERNVL_TILE],
        "patch_size": [14, 14],
    }
    return AutoConfig.for_model(
        "internvl",
        text_config=_qwen2_text(tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate),
        vision_config=vision,
        image_token_id=tokenizer.context_image_token_id,
        image_seq_length=(INTERNVL_TILE // 28) ** 2,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )


def _internvl_processor(tokenizer, *, max_patches: int = 6):
    """Return InternVL's processor: GOT-OCR2 tiling (1-`max_patches` tiles + thumbnail), 112 px tiles."""
    from transformers.models.got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.internvl import InternVLProcessor, InternVLVideoProcessor

    tile = {"height": INTERNVL_TILE, "width": INTERNVL_TILE}
    return InternVLProcessor(
        GotOcr2ImageProcessor(size=tile, crop_to_patches=True, min_patches=1, max_patches=max_patches),
        tokenizer,
        InternVLVideoProcessor(size=tile),
        image_seq_length=(INTERNVL_TILE // 28) ** 2,
        chat_template=INTERNVL_CHAT_TEMPLATE,
    )


def tiny_tokenizer(family: str, words: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """Return the tiny word-level tokenizer of `family` (LLaVA adds its `<image>` token and template)."""
    if family in LLAVA_FAMILIES:
        return build_tokenizer(words, (LLAVA_IMAGE_TOKEN, LLAVA_VIDEO_TOKEN), LLAVA_CHAT_TEMPLATE)
    if family == "internvl":
        return build_tokenizer(
            words, tuple(INTERNVL_TOKENS.values()), INTERNVL_CHAT_TEMPLATE, named=INTERNVL_TOKENS
        )
    return build_tokenizer(words)


def tiny_processor(
    family: str,
    tokenizer: PreTrainedTokenizerFast,
    *,
    min_pixels: int = 4 * 32 * 32,
    max_pixels: int = 64 * 32 * 32,
    **llava_kwargs,
):
    """Return the real processor class of `family` around `tokenizer`, with small pixel budgets.

    `llava_kwargs` go to the LLaVA (`side`, `pad`) or InternVL (`max_patches`) processor builders.
    """
    if family in LLAVA_FAMILIES:
        return _llava_processor(family, tokenizer, **llava_kwargs)
    if family == "internvl":
        return _internvl_processor(tokenizer, **llava_kwargs)
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    patch = 16 if family == "qwen3_vl" else 14
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    image_processor = Qwen2VLImageProcessor(patch_size=patch, size=size, merge_size=2, temporal_patch_size=2)
    if family == "qwen3_vl":
        from transformers.models.qwen3_vl import Qwen3VLProcessor, Qwen3VLVideoProcessor

        video_processor = Qwen3VLVideoProcessor(
            patch_size=patch,
            size=size,
            merge_size=2,
            temporal_patch_size=2,
            do_sample_frames=False,
            cap_pixels_per_frame=False,
        )
        return Qwen3VLProcessor(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)
    video_processor = Qwen2VLVideoProcessor(
        patch_size=patch,
        size=size,
        merge_size=2,
        temporal_patch_size=2,
        do_sample_frames=False,
        cap_pixels_per_frame=False,
    )
    if family == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor

        return Qwen2_5_VLProcessor(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)
    from transformers.models.qwen2_vl import Qwen2VLProcessor

    return Qwen2VLProcessor(image_processor, tokenizer, video_processor, chat_template=CHAT_TEMPLATE)


def build_tiny_checkpoint(
    family: str,
    out: str | Path,
    *,
    words: Iterable[str] = (),
    seed: int = 0,
    processor_kwargs: dict | None = None,
    **config_kwargs,
) -> Path:
    """Write a random-init checkpoint of `family` with its tokenizer and processor to `out`; return `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(family, words)
    config = tiny_config(family, tokenizer, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    model.eval()
    model.save_pretrained(out)
    tiny_processor(family, tokenizer, **(processor_kwargs or {})).save_pretrained(out)
    return out


def load_tiny(path: str | Path, attn_implementation: str | dict = "sdpa"):
    """Load a checkpoint written by `build_tiny_checkpoint` with the stock Auto classes (fp32, eval)."""
    model = AutoModelForImageTextToText.from_pretrained(
        path, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return model.eval(), AutoProcessor.from_pretrained(path)


# Released checkpoints' geometry: the fields of a published config.json that decide where visual tokens sit.
# Tiny checkpoints built from them keep tiny widths but these values (`build_released_checkpoint`).
VISION_GEOMETRY = (
    "image_size",
    "patch_size",
    "spatial_merge_size",
    "spatial_patch_size",
    "temporal_patch_size",
    "window_size",
    "num_position_embeddings",
)
TOP_GEOMETRY = (
    "image_grid_pinpoints",
    "vision_aspect_ratio",
    "vision_feature_layer",
    "vision_feature_select_strategy",
    "downsample_ratio",
    "image_seq_length",
)
PROCESSOR_CLASSES = {
    "qwen2_vl": "Qwen2VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
    "qwen3_vl": "Qwen3VLProcessor",
    "llava": "LlavaProcessor",
    "llava_next": "LlavaNextProcessor",
    "llava_onevision": "LlavaOnevisionProcessor",
    "internvl": "InternVLProcessor",
}


def _read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text()) if path.exists() else {}


def released_config(config_dir: str | Path, tokenizer: PreTrainedTokenizerFast, **config_kwargs) -> object:
    """Return a tiny config of the family of `config_dir/config.json` with its released vision geometry."""
    released = _read_json(Path(config_dir) / "config.json")
    family = released["model_type"]
    config = tiny_config(family, tokenizer, **config_kwargs)
    vision = config.vision_config
    for key in VISION_GEOMETRY:
        if key in released.get("vision_config", {}):
            setattr(vision, key, released["vision_config"][key])
    for key in TOP_GEOMETRY:
        if key in released:
            setattr(config, key, released[key])
    return config


def released_processor(config_dir: str | Path, tokenizer: PreTrainedTokenizerFast):
    """Return the family's processor built from the published processor files in `config_dir`.

    The image processor is loaded from `preprocessor_config.json` as published; the processor takes the
    published `processor_config.json` settings; a video processor comes from
    `video_preprocessor_config.json` where the checkpoint publishes one, else from the image settings.
    Only the tokenizer (and its chat template) is the tiny one.
    """
    import transformers
    from transformers import AutoImageProcessor

    config_dir = Path(config_dir)
    family = _read_json(config_dir / "config.json")["model_type"]
    image_processor = AutoImageProcessor.from_pretrained(config_dir)
    settings = {
        k: v for k, v in _read_json(config_dir / "processor_config.json").items() if k != "processor_class"
    }
    cls = getattr(transformers, PROCESSOR_CLASSES[family])
    template = tokenizer.chat_template
    if family in ("llava", "llava_next"):
        return cls(
            image_processor, tokenizer, chat_template=template, image_token=LLAVA_IMAGE_TOKEN, **settings
        )
    video_processor = _released_video_processor(family, config_dir, image_processor)
    if family == "llava_onevision":
        return cls(image_processor, tokenizer, video_processor, chat_template=template, **settings)
    return cls(image_processor, tokenizer, video_processor, chat_template=template, **settings)


def _released_video_processor(family: str, config_dir: Path, image_processor):
    import transformers

    published = config_dir / "video_preprocessor_config.json"
    if published.exists():
        from transformers import AutoVideoProcessor

        return AutoVideoProcessor.from_pretrained(config_dir)
    if family in FAMILIES:  # Qwen2/2.5-VL publish one preprocessor_config.json for images and video
        kwargs = {
            k: getattr(image_processor, k)
            for k in ("patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std", "size")
        }
        return transformers.Qwen2VLVideoProcessor(**kwargs)
    if family == "llava_onevision":
        return transformers.LlavaOnevisionVideoProcessor(
            size=image_processor.size,
            image_mean=image_processor.image_mean,
            image_std=image_processor.image_std,
        )
    return transformers.InternVLVideoProcessor(
        size=image_processor.size, image_mean=image_processor.image_mean, image_std=image_processor.image_std
    )


def build_released_checkpoint(
    config_dir: str | Path,
    out: str | Path,
    *,
    words: Iterable[str] = (),
    seed: int = 0,
    **config_kwargs,
) -> Path:
    """Write a random-init tiny checkpoint with a released checkpoint's vision geometry and processor files.

    `config_dir` holds the published `config.json` (at least `model_type` and the vision geometry),
    `preprocessor_config.json` and, where published, `processor_config.json` /
    `video_preprocessor_config.json`. Widths and depths stay tiny (`config_kwargs` as in `tiny_config`).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    family = _read_json(Path(config_dir) / "config.json")["model_type"]
    tokenizer = tiny_tokenizer(family, words)
    config = released_config(config_dir, tokenizer, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    model.eval()
    model.save_pretrained(out)
    released_processor(config_dir, tokenizer).save_pretrained(out)
    return out
