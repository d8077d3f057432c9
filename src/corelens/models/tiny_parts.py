"""What every family's tiny checkpoint shares: the word-level tokenizer, the Qwen-VL chat template, a Qwen2 decoder.

The family files (`corelens/models/families/`) build their tiny configs, tokenizers and processors from these;
`corelens.models.tiny` assembles them into checkpoints. Nothing here downloads anything.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

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


def qwen2_text(tokenizer, hidden, layers, heads, kv_heads, head_dim, intermediate) -> dict:
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
