"""Tiny random Qwen2.5-VL models and a working processor, built with no network, for tests and examples."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from ..processors import QwenVideoPatcher, QwenVLInputs
from .tokenizer import QWEN_SPECIAL_TOKENS, build_tokenizer

#: Small images: 28x28-pixel merged tokens, between 4 and 64 of them per image or frame pair.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 64 * 28 * 28


def tiny_processor() -> QwenVLInputs:
    """Qwen-VL preprocessing around the local tokenizer, the real (PIL) Qwen2-VL image processor and the video patcher."""
    tokenizer = build_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    patcher = QwenVideoPatcher(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return QwenVLInputs(tokenizer, image_processor, patcher)


def tiny_qwen2_5_vl(
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    logit_scale: float = 20.0,
) -> Qwen2_5_VLForConditionalGeneration:
    """A random Qwen2.5-VL sized for unit tests (float32, eval mode), sharing the tiny tokenizer's ids.

    The output head is scaled by `logit_scale` so next-token distributions are peaked, as a trained model's are;
    with flat random distributions an entropy-adaptive policy has nothing to adapt to.
    """
    tokenizer = build_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS}
    head_dim = hidden_size // heads
    quarter = head_dim // 2 // 4
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=num_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=4096,
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [head_dim // 2 - 2 * quarter, quarter, quarter],
                "rope_theta": 10000.0,
            },
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=hidden_size,
            fullatt_block_indexes=[1],
            window_size=56,
            tokens_per_second=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model


def noisy_copy(model: torch.nn.Module, scale: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """A copy of `model` with Gaussian noise added to every weight: a draft that agrees often, not always."""
    clone = type(model)(model.config).eval()
    clone.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale * (p.std() if p.numel() > 1 else 1.0))
    clone.generation_config = model.generation_config
    return clone


def sample_image(seed: int = 0, size: tuple[int, int] = (96, 128)) -> Image.Image:
    """A deterministic random RGB image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def sample_frames(seed: int = 0, num_frames: int = 4, size: tuple[int, int] = (56, 84)) -> np.ndarray:
    """Deterministic random video frames `(T, H, W, 3)` uint8."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (num_frames, *size, 3), dtype=np.uint8)


def qwen_inputs(
    processor: QwenVLInputs,
    prompt: str,
    images: list[Image.Image] | None = None,
    video: np.ndarray | None = None,
    video_fps: float = 2.0,
) -> dict[str, Any]:
    """Chat-formatted model inputs for one user turn with images and/or one video, then the prompt."""
    images = images or []
    content = [{"type": "image"} for _ in images]
    if video is not None:
        content.append({"type": "video"})
    content.append({"type": "text", "text": prompt})
    text = processor.apply_chat_template([{"role": "user", "content": content}])
    return dict(processor(text, images=images, videos=None if video is None else [video], video_fps=video_fps))
