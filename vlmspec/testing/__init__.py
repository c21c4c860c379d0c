"""Offline fixtures: tiny random models, a local tokenizer and real processor classes."""

from .qwen2_5_vl import noisy_copy, qwen_inputs, sample_frames, sample_image, tiny_processor, tiny_qwen2_5_vl
from .tokenizer import build_tokenizer

__all__ = [
    "build_tokenizer",
    "noisy_copy",
    "qwen_inputs",
    "sample_frames",
    "sample_image",
    "tiny_processor",
    "tiny_qwen2_5_vl",
]
