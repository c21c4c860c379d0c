"""LLaVA-OneVision: 1-D RoPE; anyres image features (with image_newline tokens) and pooled video frames."""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from .base import ModelAdapter, VideoProcessing, VisualLayout, split_runs


class LlavaOnevisionAdapter(ModelAdapter):
    model_classes = ("LlavaOnevisionForConditionalGeneration",)
    quantization_skip_modules = ("model.vision_tower", "model.multi_modal_projector", "lm_head")
    special_token_attributes = ("image_token_id", "video_token_id", "image_token_index", "video_token_index")
    input_keys = (
        "input_ids",
        "attention_mask",
        "pixel_values",
        "image_sizes",
        "pixel_values_videos",
        "image_sizes_videos",
        "batch_num_images",
    )
    video_processing = VideoProcessing(
        processor_classes=("LlavaOnevisionProcessor",),
        video_processor="LlavaOnevisionVideoProcessor",
        defaults=dict(size={"height": 384, "width": 384}, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD),
        packing="pooled-frames",
        sampling="uniform",
    )

    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.arange(inputs["input_ids"].shape[1], device=inputs["input_ids"].device)[None]

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions[None]

    def visual_layout(self, inputs: dict[str, Any]) -> VisualLayout:
        """One group per image (base view, crops and newlines); one per pooled video frame, the final newline last."""
        input_ids = inputs["input_ids"]
        mask = self.visual_token_mask(input_ids)
        vision = self.model.config.vision_config
        per_frame = math.ceil(vision.image_size // vision.patch_size / 2) ** 2
        video_id = self.model.config.video_token_id
        groups, group = [], 0
        for start, end in split_runs(mask):
            if int(input_ids[0, start]) == video_id:
                frames = max(1, (end - start - 1) // per_frame)
                groups.append(group + (torch.arange(end - start) // per_frame).clamp_max(frames - 1))
                group += frames
            else:
                groups.append(torch.full((end - start,), group))
                group += 1
        empty = torch.zeros(0, dtype=torch.long)
        return VisualLayout(mask, torch.cat(groups).to(input_ids.device) if groups else empty.to(input_ids.device))
