"""Qwen2.5-VL: M-RoPE with absolute time (seconds per temporal grid) on the video axis."""

from __future__ import annotations

from .mrope import MRopeAdapter


class Qwen2_5_VLAdapter(MRopeAdapter):
    model_classes = ("Qwen2_5_VLForConditionalGeneration",)
    quantization_skip_modules = ("model.visual", "lm_head")
    input_keys = (
        "input_ids",
        "attention_mask",
        "pixel_values",
        "image_grid_thw",
        "pixel_values_videos",
        "video_grid_thw",
        "second_per_grid_ts",
        "mm_token_type_ids",
    )
    rope_index_keys = ("second_per_grid_ts",)
