"""LLaVA-OneVision: 1-D RoPE; anyres image features (with image_newline tokens) and pooled video frames."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from .base import ModelAdapter, Prefill


class LlavaOnevisionAdapter(ModelAdapter):
    model_classes = ("LlavaOnevisionForConditionalGeneration",)
    quantization_skip_modules = ("model.vision_tower", "model.multi_modal_projector", "lm_head")
    input_keys = (
        "input_ids",
        "attention_mask",
        "pixel_values",
        "image_sizes",
        "pixel_values_videos",
        "image_sizes_videos",
        "batch_num_images",
    )

    def prefill(self, inputs: dict[str, Any], cache: DynamicCache) -> Prefill:
        length = inputs["input_ids"].shape[1]
        positions = torch.arange(length, device=inputs["input_ids"].device)[None]
        model_inputs = {k: inputs[k] for k in self.input_keys if inputs.get(k) is not None}
        out = self.model(**model_inputs, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return Prefill(last_logits=out.logits[0, -1], length=length, next_position=length)

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions[None]
