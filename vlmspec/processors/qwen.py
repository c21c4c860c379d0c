"""Qwen-VL model inputs from chat text, images and video frames, without `transformers`' processor class.

`Qwen2_5_VLProcessor` cannot be built where torchvision is missing (its video-processor slot needs it), as on
CPU-only torch installs. This does the same work from the real image processor, the tokenizer and
`QwenVideoPatcher`: expand each visual placeholder to its token count and mark tokens with `mm_token_type_ids`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature, PreTrainedTokenizerBase

from .qwen_video import QwenVideoPatcher

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"


class QwenVLInputs:
    """Callable like a processor: `(text, images=..., videos=...)` -> input_ids, pixel values, grids, token types."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, image_processor: Any, video_patcher: QwenVideoPatcher,
        chat_template: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.video_patcher = video_patcher
        self.chat_template = chat_template or tokenizer.chat_template
        self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
        self.merge_length = video_patcher.merge_size**2

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def __call__(
        self,
        text: str,
        images: Sequence[Image.Image] | None = None,
        videos: Sequence[np.ndarray] | None = None,
        video_fps: float = 2.0,
    ) -> BatchFeature:
        images, videos = list(images or []), list(videos or [])
        data: dict[str, torch.Tensor] = {}
        if images:
            image_inputs = self.image_processor(images=images, return_tensors="pt")
            data["pixel_values"] = image_inputs["pixel_values"]
            data["image_grid_thw"] = image_inputs["image_grid_thw"]
            text = self._expand(text, IMAGE_TOKEN, data["image_grid_thw"])
        if videos:
            patched = [self.video_patcher(v) for v in videos]
            data["pixel_values_videos"] = torch.cat([p["pixel_values_videos"] for p in patched])
            data["video_grid_thw"] = torch.cat([p["video_grid_thw"] for p in patched])
            data["second_per_grid_ts"] = torch.full((len(videos),), self.video_patcher.temporal_patch_size / video_fps)
            text = self._expand(text, VIDEO_TOKEN, data["video_grid_thw"])
        input_ids = torch.tensor([self.tokenizer(text, add_special_tokens=False)["input_ids"]])
        token_types = torch.zeros_like(input_ids, dtype=torch.int)
        token_types[input_ids == self.image_token_id] = 1
        token_types[input_ids == self.video_token_id] = 2
        return BatchFeature(
            {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "mm_token_type_ids": token_types, **data}
        )

    def _expand(self, text: str, token: str, grids: torch.Tensor) -> str:
        """Replace the i-th `token` placeholder by as many copies as the i-th grid yields merged tokens."""
        parts = text.split(token)
        if len(parts) - 1 != grids.shape[0]:
            raise ValueError(f"the prompt has {len(parts) - 1} {token} placeholders for {grids.shape[0]} inputs")
        counts = (grids.prod(dim=1) // self.merge_length).tolist()
        return parts[0] + "".join(token * int(n) + part for n, part in zip(counts, parts[1:]))
