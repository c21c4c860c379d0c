"""Tiny random Qwen3-VL and Qwen3-VL-MoE models and a working processor, built with no network."""

from __future__ import annotations

import torch
from transformers import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ..processors import QwenVideoPacker, QwenVideoPatcher, VisualInputs, image_only
from .common import sharpen
from .qwen2_5_vl import qwen_token_ids
from .tokenizer import build_tokenizer

#: Qwen3-VL uses 16-pixel patches: 32x32-pixel merged tokens, between 4 and 48 per image or frame pair.
MIN_PIXELS = 4 * 32 * 32
MAX_PIXELS = 48 * 32 * 32


def tiny_qwen3_vl_processor() -> VisualInputs:
    """The real Qwen3-VL processor class (text, images) around the local tokenizer, plus timestamped video packing."""
    tokenizer = build_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    processor = image_only(Qwen3VLProcessor)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
    )
    patcher = QwenVideoPatcher(
        patch_size=16, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, image_mean=(0.5,) * 3, image_std=(0.5,) * 3
    )
    return VisualInputs(processor, QwenVideoPacker(patcher, timestamps=True))


def _text_config(hidden_size: int, num_layers: int, heads: int, kv_heads: int, **extra) -> dict:
    ids = qwen_token_ids()
    head_dim = hidden_size // heads
    quarter = head_dim // 2 // 4
    return dict(
        vocab_size=len(build_tokenizer()),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter],
            "mrope_interleaved": True,
            "rope_theta": 10000.0,
        },
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        **extra,
    )


def _vision_config(out_hidden_size: int) -> dict:
    return dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=16,
        out_hidden_size=out_hidden_size,
        num_position_embeddings=64,
        deepstack_visual_indexes=[0, 1],
    )


def _finish(model, logit_scale: float):
    ids = qwen_token_ids()
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return sharpen(model, logit_scale)


def _special_ids() -> dict[str, int]:
    ids = qwen_token_ids()
    return dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def tiny_qwen3_vl(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    logit_scale: float = 20.0,
) -> Qwen3VLForConditionalGeneration:
    """A random dense Qwen3-VL (interleaved M-RoPE, deepstack into both decoder layers), float32, eval mode."""
    config = Qwen3VLConfig(
        text_config=_text_config(hidden_size, num_layers, heads, kv_heads),
        vision_config=_vision_config(hidden_size),
        **_special_ids(),
    )
    torch.manual_seed(seed)
    return _finish(Qwen3VLForConditionalGeneration(config), logit_scale)


def tiny_qwen3_vl_moe(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    logit_scale: float = 20.0,
) -> Qwen3VLMoeForConditionalGeneration:
    """A random Qwen3-VL-MoE (8 experts, 2 per token) that a dense `tiny_qwen3_vl` can draft for."""
    config = Qwen3VLMoeConfig(
        text_config=_text_config(
            hidden_size, num_layers, heads, kv_heads, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32
        ),
        vision_config=_vision_config(hidden_size),
        **_special_ids(),
    )
    torch.manual_seed(seed)
    return _finish(Qwen3VLMoeForConditionalGeneration(config), logit_scale)
