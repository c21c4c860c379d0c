"""The demo pair's architecture: a Qwen2.5-VL target (~20 M language-model parameters) and a ~0.55 M draft."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ..processors import QwenVideoPacker, QwenVideoPatcher, VisualInputs, image_only
from ..testing.qwen2_5_vl import qwen2_5_vl_model
from ..testing.tokenizer import train_tokenizer
from .synthetic import IMAGE_SIZE, corpus

VOCAB_SIZE = 1024
PIXELS = IMAGE_SIZE * IMAGE_SIZE

TARGET = dict(hidden_size=512, num_layers=7, heads=8, kv_heads=2, intermediate_size=1376)
TARGET.update(vision_depth=4, vision_hidden=192, vision_heads=3)
DRAFT = dict(hidden_size=128, num_layers=2, heads=2, kv_heads=1, intermediate_size=384)
DRAFT.update(vision_depth=2, vision_hidden=64, vision_heads=1)


def build_demo_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the suite's captions, with the Qwen-VL special tokens."""
    return train_tokenizer(corpus(), VOCAB_SIZE)


def build_demo_processor(tokenizer: PreTrainedTokenizerFast) -> VisualInputs:
    """112x112 images (16 visual tokens) and 8-frame videos (64 visual tokens)."""
    processor = image_only(Qwen2_5_VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=PIXELS, max_pixels=PIXELS),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    return VisualInputs(
        processor, QwenVideoPacker(QwenVideoPatcher(min_pixels=PIXELS, max_pixels=PIXELS), timestamps=False)
    )


def build_model(tokenizer: PreTrainedTokenizerFast, spec: dict) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL of the given size (`TARGET` or `DRAFT`), sharing `tokenizer`'s ids."""
    return qwen2_5_vl_model(tokenizer, window_size=IMAGE_SIZE, max_positions=2048, **spec)


def language_model_parameters(model: Qwen2_5_VLForConditionalGeneration) -> int:
    """Parameters of the language model and output head (the vision tower excluded)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("model.visual"))
