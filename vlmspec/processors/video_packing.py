"""Per-family video packing: decoded frames -> the model's video tensors and the prompt text that stands for them.

Each packer mirrors its family's `transformers` video processor and prompt expansion, which need torchvision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .media import Video
from .qwen_video import QwenVideoPatcher


class QwenVideoPacker:
    """Qwen2.5-VL (one block of video tokens, seconds per temporal grid) or Qwen3-VL (timestamped frame blocks)."""

    marker = "<|vision_start|><|video_pad|><|vision_end|>"

    def __init__(self, patcher: QwenVideoPatcher, timestamps: bool):
        self.patcher = patcher
        self.timestamps = timestamps

    def __call__(self, video: Video) -> tuple[dict[str, torch.Tensor], str]:
        out = self.patcher(video.frames)
        grid_t, grid_h, grid_w = out["video_grid_thw"][0].tolist()
        per_frame = grid_h * grid_w // self.patcher.merge_size**2
        start, pad, end = "<|vision_start|>", "<|video_pad|>", "<|vision_end|>"
        if not self.timestamps:
            out["second_per_grid_ts"] = torch.tensor([self.patcher.temporal_patch_size / video.sample_fps])
            return out, start + pad * (per_frame * grid_t) + end
        indices = video.indices.tolist()
        step = self.patcher.temporal_patch_size
        indices += [indices[-1]] * (-len(indices) % step)
        seconds = [(indices[i] + indices[i + step - 1]) / 2 / video.fps for i in range(0, len(indices), step)]
        return out, "".join(f"<{s:.1f} seconds>{start}{pad * per_frame}{end}" for s in seconds)

    @staticmethod
    def collate(packed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {key: torch.cat([p[key] for p in packed]) for key in packed[0]}


class LlavaOnevisionVideoPacker:
    """LLaVA-OneVision: every frame resized to the vision tower's square input; 2x2-pooled tokens plus one newline."""

    marker = "<video>"

    def __init__(self, size: int, image_mean: Sequence[float], image_std: Sequence[float], num_image_tokens: int):
        self.size = size
        self.mean = torch.tensor(image_mean).view(1, 3, 1, 1)
        self.std = torch.tensor(image_std).view(1, 3, 1, 1)
        self.num_image_tokens = num_image_tokens

    def __call__(self, video: Video) -> tuple[dict[str, torch.Tensor], str]:
        frames = torch.as_tensor(np.asarray(video.frames)).permute(0, 3, 1, 2).float()
        frames = F.interpolate(frames, size=(self.size, self.size), mode="bicubic", antialias=True, align_corners=False)
        frames = (frames.round().clamp(0, 255) / 255.0 - self.mean) / self.std
        pooled = math.ceil(int(math.sqrt(self.num_image_tokens)) / 2)
        return {"pixel_values_videos": frames[None]}, self.marker * (frames.shape[0] * pooled * pooled + 1)

    @staticmethod
    def collate(packed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {"pixel_values_videos": torch.cat([p["pixel_values_videos"] for p in packed])}
