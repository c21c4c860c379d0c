"""Qwen2.5-VL: M-RoPE with absolute time (seconds per temporal grid) on the video axis."""

from __future__ import annotations

from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from .base import VideoProcessing
from .mrope import QWEN_VIDEO_DEFAULTS, MRopeAdapter


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
    video_processing = VideoProcessing(
        processor_classes=("Qwen2VLProcessor", "Qwen2_5_VLProcessor"),
        video_processor="Qwen2VLVideoProcessor",
        defaults=dict(
            QWEN_VIDEO_DEFAULTS,
            size={"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
            image_mean=OPENAI_CLIP_MEAN,
            image_std=OPENAI_CLIP_STD,
            patch_size=14,
        ),
        pixel_bounds=True,
    )
