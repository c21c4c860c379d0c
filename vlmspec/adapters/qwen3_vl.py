"""Qwen3-VL and Qwen3-VL-MoE: interleaved M-RoPE, per-frame video blocks with timestamps, deepstack features.

Deepstack visual features enter early decoder layers at the visual positions; a pruned prefill keeps the rows of
the kept visual tokens. A dense Qwen3-VL drafts for a Qwen3-VL-MoE target.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD

from .base import VideoProcessing, kept_index
from .mrope import QWEN_VIDEO_DEFAULTS, MRopeAdapter


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
    video_processing = VideoProcessing(
        processor_classes=("Qwen3VLProcessor",),
        video_processor="Qwen3VLVideoProcessor",
        defaults=dict(
            QWEN_VIDEO_DEFAULTS,
            size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
            image_mean=IMAGENET_STANDARD_MEAN,
            image_std=IMAGENET_STANDARD_STD,
            patch_size=16,
            fps=2,
        ),
        timestamps=True,
        whole_temporal_patch=True,
    )

    def prune_language_model_inputs(self, kwargs: dict[str, Any], keep: torch.Tensor) -> dict[str, Any]:
        visual = kwargs.get("visual_pos_masks")
        if visual is not None and kwargs.get("deepstack_visual_embeds") is not None:
            kept_visual = keep[visual]
            kwargs["deepstack_visual_embeds"] = [e[kept_visual] for e in kwargs["deepstack_visual_embeds"]]
            index, real = kept_index(keep)
            kwargs["visual_pos_masks"] = visual.gather(1, index).logical_and_(real)
        return super().prune_language_model_inputs(kwargs, keep)
