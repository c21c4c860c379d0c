"""Qwen2.5-VL: 3-D M-RoPE positions from `get_rope_index`; text after the prompt advances all three axes together."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from .base import ModelAdapter, Prefill

_VISUAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


class Qwen2_5_VLAdapter(ModelAdapter):
    model_classes = ("Qwen2_5_VLForConditionalGeneration",)

    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`(3, 1, L)` positions as `generate` builds them: 3-D for visual prompts given `mm_token_type_ids`."""
        input_ids = inputs["input_ids"]
        has_visual = inputs.get("image_grid_thw") is not None or inputs.get("video_grid_thw") is not None
        if inputs.get("mm_token_type_ids") is not None and has_visual:
            positions, _ = self.model.model.get_rope_index(
                input_ids,
                inputs["mm_token_type_ids"],
                image_grid_thw=inputs.get("image_grid_thw"),
                video_grid_thw=inputs.get("video_grid_thw"),
                second_per_grid_ts=inputs.get("second_per_grid_ts"),
                attention_mask=inputs.get("attention_mask"),
            )
            return positions
        return torch.arange(input_ids.shape[1], device=input_ids.device).view(1, 1, -1).expand(3, 1, -1)

    def prefill(self, inputs: dict[str, Any], cache: DynamicCache) -> Prefill:
        positions = self.prompt_positions(inputs)
        model_inputs = {k: inputs[k] for k in ("input_ids", "attention_mask", *_VISUAL_KEYS) if inputs.get(k) is not None}
        out = self.model(**model_inputs, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return Prefill(
            last_logits=out.logits[0, -1],
            length=inputs["input_ids"].shape[1],
            next_position=int(positions.max()) + 1,
        )

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions.view(1, 1, -1).expand(3, 1, -1)
