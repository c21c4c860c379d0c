"""A small byte-level BPE tokenizer built offline with `tokenizers`, with the Qwen-VL special tokens."""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

LLAVA_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>\n{% elif content['type'] == 'video' %}<video>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = (
    "Describe the image in detail. Describe the video in detail. What is shown here?",
    "A red circle moves to the left while a blue square stays in the middle of the frame.",
    "There are three green triangles and one yellow star on a white background.",
    "The small purple ball bounces up and down, then rolls to the right corner.",
    "In the first frame the orange box is large; later it becomes smaller and turns grey.",
    "user assistant system: you are a helpful assistant that answers questions about pictures.",
)


def train_tokenizer(
    texts: list[str],
    vocab_size: int,
    special_tokens: tuple[str, ...] = QWEN_SPECIAL_TOKENS,
    chat_template: str = QWEN_CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts` (every string stays encodable), ending turns with <|im_end|>."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=chat_template
    )


@lru_cache(maxsize=8)
def build_tokenizer(
    vocab_size: int = 320,
    special_tokens: tuple[str, ...] = QWEN_SPECIAL_TOKENS,
    chat_template: str = QWEN_CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """The fixtures' tokenizer: trained on a small built-in corpus, deterministic."""
    return train_tokenizer([line for line in _CORPUS for _ in range(8)], vocab_size, special_tokens, chat_template)
