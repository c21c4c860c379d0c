"""Qwen-VL video tensors from decoded frames, computed with torch alone.

`transformers`' Qwen2-VL video processor needs torchvision, which CPU-only torch installs often lack. This is the
same computation (smart resize to a multiple of patch x merge, bicubic antialiased resize, rescale, normalise, pad
the frame count to the temporal patch, flatten patches in the vision tower's order), used when that class can't run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize


@dataclass
class QwenVideoPatcher:
    """Frames `(T, H, W, 3)` uint8 -> `pixel_values_videos`, `video_grid_thw` like Qwen2VLVideoProcessor."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    image_mean: tuple[float, ...] = tuple(OPENAI_CLIP_MEAN)
    image_std: tuple[float, ...] = tuple(OPENAI_CLIP_STD)

    def __call__(self, frames: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:
        video = torch.as_tensor(np.asarray(frames))
        if video.ndim != 4 or video.shape[-1] != 3:
            raise ValueError(f"expected frames of shape (T, H, W, 3), got {tuple(video.shape)}")
        video = video.permute(0, 3, 1, 2).float()
        height, width = video.shape[-2:]
        factor = self.patch_size * self.merge_size
        new_h, new_w = smart_resize(
            height, width, factor=factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels
        )
        if (new_h, new_w) != (height, width):
            video = F.interpolate(video, size=(new_h, new_w), mode="bicubic", antialias=True, align_corners=False)
            video = video.round().clamp(0, 255)
        mean = torch.tensor(self.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std).view(1, 3, 1, 1)
        video = (video / 255.0 - mean) / std
        if pad := -video.shape[0] % self.temporal_patch_size:
            video = torch.cat([video, video[-1:].expand(pad, -1, -1, -1)])
        t, c = video.shape[0], video.shape[1]
        ps, ms, tps = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_t, grid_h, grid_w = t // tps, new_h // ps, new_w // ps
        patches = video.view(grid_t, tps, c, grid_h // ms, ms, ps, grid_w // ms, ms, ps)
        patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return {
            "pixel_values_videos": patches.reshape(grid_t * grid_h * grid_w, c * tps * ps * ps),
            "video_grid_thw": torch.tensor([[grid_t, grid_h, grid_w]]),
        }
