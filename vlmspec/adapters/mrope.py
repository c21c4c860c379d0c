"""The Qwen-VL families' shared rule: 3-D M-RoPE positions for the prompt, all three axes advancing together after it."""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from .base import ModelAdapter, Prefill


class MRopeAdapter(ModelAdapter):
    """Prefill with the positions `generate` would build (`get_rope_index` when `mm_token_type_ids` is given)."""

    #: Extra inputs `get_rope_index` reads besides ids, token types, grids and mask (e.g. seconds per grid).
    rope_index_keys: tuple[str, ...] = ()

    def prompt_positions(self, inputs: dict[str, Any]) -> torch.Tensor:
        """`(3, 1, L)` prompt positions: 3-D for visual prompts given `mm_token_type_ids`, else 1-D on all axes."""
        input_ids = inputs["input_ids"]
        has_visual = inputs.get("image_grid_thw") is not None or inputs.get("video_grid_thw") is not None
        if inputs.get("mm_token_type_ids") is not None and has_visual:
            positions, _ = self.model.model.get_rope_index(
                input_ids,
                inputs["mm_token_type_ids"],
                image_grid_thw=inputs.get("image_grid_thw"),
                video_grid_thw=inputs.get("video_grid_thw"),
                attention_mask=inputs.get("attention_mask"),
                **{k: inputs[k] for k in self.rope_index_keys if inputs.get(k) is not None},
            )
            return positions
        return torch.arange(input_ids.shape[1], device=input_ids.device).view(1, 1, -1).expand(3, 1, -1)

    def prefill(self, inputs: dict[str, Any], cache: DynamicCache) -> Prefill:
        positions = self.prompt_positions(inputs)
        model_inputs = {k: inputs[k] for k in self.input_keys if k != "mm_token_type_ids" and inputs.get(k) is not None}
        out = self.model(**model_inputs, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return Prefill(
            last_logits=out.logits[0, -1],
            length=inputs["input_ids"].shape[1],
            next_position=int(positions.max()) + 1,
        )

    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        return positions.view(1, 1, -1).expand(3, 1, -1)
