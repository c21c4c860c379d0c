"""Qwen3-VL and Qwen3-VL-MoE: interleaved M-RoPE, per-frame video blocks with timestamps, deepstack features.

Deepstack visual features enter early decoder layers only while the prompt is prefilled, so decoding tree nodes
needs nothing beyond the shared M-RoPE rule. A dense Qwen3-VL drafts for a Qwen3-VL-MoE target.
"""

from __future__ import annotations

from .mrope import MRopeAdapter


class Qwen3VLAdapter(MRopeAdapter):
    model_classes = ("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration")
    quantization_skip_modules = ("model.visual", "lm_head")
    input_keys = (
        "input_ids",
        "attention_mask",
        "pixel_values",
        "image_grid_thw",
        "pixel_values_videos",
        "video_grid_thw",
        "mm_token_type_ids",
    )
