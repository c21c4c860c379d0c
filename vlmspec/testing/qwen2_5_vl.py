"""Tiny random Qwen2.5-VL models and a working processor, built with no network, for tests and examples."""

from __future__ import annotations

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.utils import is_torchvision_available

from ..processors import QwenVideoPacker, QwenVideoPatcher, VisualInputs, image_only
from .common import sharpen
from .tokenizer import QWEN_SPECIAL_TOKENS, build_tokenizer

#: Small images: 28x28-pixel merged tokens, between 4 and 64 of them per image or frame pair.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 64 * 28 * 28


def qwen_token_ids() -> dict[str, int]:
    tokenizer = build_tokenizer()
    return {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}


def tiny_processor() -> VisualInputs:
    """The real Qwen2.5-VL processor class (text, images) around the local tokenizer, plus the video packer.

    Its image processor is the one `AutoProcessor` loads: the torchvision backend where torchvision is installed.
    """
    tokenizer = build_tokenizer()
    if is_torchvision_available():
        from transformers import Qwen2VLImageProcessor as image_processor_class
    else:
        image_processor_class = Qwen2VLImageProcessorPil
    processor = image_only(Qwen2_5_VLProcessor)(
        image_processor=image_processor_class(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )
    patcher = QwenVideoPatcher(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return VisualInputs(processor, QwenVideoPacker(patcher, timestamps=False))


def qwen2_5_vl_model(
    tokenizer,
    hidden_size: int,
    num_layers: int,
    heads: int,
    kv_heads: int,
    intermediate_size: int,
    vision_depth: int = 2,
    vision_hidden: int = 32,
    vision_heads: int = 2,
    window_size: int = 56,
    max_positions: int = 4096,
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL sharing `tokenizer`'s ids (M-RoPE sections in Qwen's 2:3:3 proportion)."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    head_dim = hidden_size // heads
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=max_positions,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16],
                "rope_theta": 10000.0,
            },
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=vision_depth,
            hidden_size=vision_hidden,
            intermediate_size=vision_hidden * 2,
            num_heads=vision_heads,
            out_hidden_size=hidden_size,
            fullatt_block_indexes=list(range(1, vision_depth, 2)),
            window_size=window_size,
            tokens_per_second=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model


def tiny_qwen2_5_vl(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    logit_scale: float = 20.0,
) -> Qwen2_5_VLForConditionalGeneration:
    """A random Qwen2.5-VL sized for unit tests (float32, eval mode), sharing the tiny tokenizer's ids."""
    torch.manual_seed(seed)
    model = qwen2_5_vl_model(build_tokenizer(), hidden_size, num_layers, heads, kv_heads, hidden_size * 2)
    return sharpen(model, logit_scale)
