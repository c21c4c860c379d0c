"""Tiny random LLaVA-OneVision models and a working processor, built with no network."""

from __future__ import annotations

import torch
from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, LlavaOnevisionProcessor
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import LlavaOnevisionImageProcessorPil

from ..processors import LlavaOnevisionVideoPacker, VisualInputs, image_only
from .common import sharpen
from .tokenizer import LLAVA_CHAT_TEMPLATE, LLAVA_SPECIAL_TOKENS, build_tokenizer

#: The vision tower sees 56x56 crops of 14-pixel patches: 16 tokens per crop, anyres grids up to 2x2 crops.
IMAGE_SIZE = 56
PATCH_SIZE = 14
GRID_PINPOINTS = [[56, 56], [56, 112], [112, 56], [112, 112]]


def llava_tokenizer():
    return build_tokenizer(special_tokens=LLAVA_SPECIAL_TOKENS, chat_template=LLAVA_CHAT_TEMPLATE)


def tiny_llava_onevision_processor() -> VisualInputs:
    """The real LLaVA-OneVision processor class (text, anyres images) plus the video packer."""
    tokenizer = llava_tokenizer()
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, image_grid_pinpoints=GRID_PINPOINTS
    )
    num_image_tokens = (IMAGE_SIZE // PATCH_SIZE) ** 2
    processor = image_only(LlavaOnevisionProcessor)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        num_image_tokens=num_image_tokens,
        vision_feature_select_strategy="full",
        chat_template=tokenizer.chat_template,
    )
    packer = LlavaOnevisionVideoPacker(
        IMAGE_SIZE, image_processor.image_mean, image_processor.image_std, num_image_tokens
    )
    return VisualInputs(processor, packer)


def tiny_llava_onevision(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    logit_scale: float = 20.0,
) -> LlavaOnevisionForConditionalGeneration:
    """A random LLaVA-OneVision (SigLIP tower, Qwen2 language model, 1-D RoPE), float32, eval mode."""
    tokenizer = llava_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in LLAVA_SPECIAL_TOKENS}
    config = LlavaOnevisionConfig(
        text_config=dict(
            model_type="qwen2",
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=4096,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=IMAGE_SIZE,
            patch_size=PATCH_SIZE,
        ),
        image_token_id=ids["<image>"],
        video_token_id=ids["<video>"],
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=GRID_PINPOINTS,
        vision_aspect_ratio="anyres_max_9",
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlavaOnevisionForConditionalGeneration(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return sharpen(model, logit_scale)
