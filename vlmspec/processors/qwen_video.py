"""Qwen-VL video tensors from decoded frames, computed with torch alone.

`transformers`' Qwen2-VL and Qwen3-VL video processors need torchvision, which CPU-only torch installs often lack.
This is the same computation: smart resize to a multiple of patch x merge (Qwen2-VL: a pixel budget per frame;
Qwen3-VL: one budget for all frames together), bicubic antialiased resize, rescale and normalise, pad the frame
count to the temporal patch, flatten patches in the vision tower's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as frame_smart_resize
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as clip_smart_resize

from .pixels import frames_tensor, resize_and_normalize

#: `max_video_tokens` of each budget when the checkpoint does not set it (Qwen2-VL's and Qwen3-VL's defaults).
_MAX_VIDEO_TOKENS = {False: 128000, True: 768}


@dataclass
class QwenVideoPatcher:
    """Frames `(T, H, W, 3)` uint8 -> `pixel_values_videos`, `video_grid_thw` like Qwen2VLVideoProcessor, or with
    `clip_budget=True` like Qwen3VLVideoProcessor (`max_pixels` then bounds all frames together).

    `cap_pixels_per_frame` and `max_video_tokens` are the processors' options of those names (qwen-vl-utils' bound).
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    image_mean: tuple[float, ...] = tuple(OPENAI_CLIP_MEAN)
    image_std: tuple[float, ...] = tuple(OPENAI_CLIP_STD)
    rescale_factor: float = 1 / 255
    cap_pixels_per_frame: bool = False
    max_video_tokens: int | None = None

    def frame_size(self, num_frames: int, height: int, width: int, clip_budget: bool = False) -> tuple[int, int]:
        """The height and width every frame of a `num_frames`-frame clip is resized to."""
        factor = self.patch_size * self.merge_size
        max_pixels = self._max_pixels(num_frames, factor, clip_budget)
        if clip_budget:
            return clip_smart_resize(
                num_frames,
                height,
                width,
                temporal_factor=self.temporal_patch_size,
                factor=factor,
                min_pixels=self.min_pixels,
                max_pixels=max_pixels,
            )
        return frame_smart_resize(height, width, factor=factor, min_pixels=self.min_pixels, max_pixels=max_pixels)

    def _max_pixels(self, num_frames: int, factor: int, clip_budget: bool) -> int:
        """`max_pixels`, or with `cap_pixels_per_frame` the share of the video-token budget each frame may take."""
        if not self.cap_pixels_per_frame:
            return self.max_pixels
        tokens = self.max_video_tokens or _MAX_VIDEO_TOKENS[clip_budget]
        floor = int(self.min_pixels * 1.05)
        if clip_budget:
            return max(min(tokens * factor * factor, self.max_pixels // num_frames), floor) * num_frames
        share = int(tokens * factor * factor * 0.9) * self.temporal_patch_size // num_frames
        return max(min(self.max_pixels, share), floor)

    def __call__(self, frames: np.ndarray | torch.Tensor, clip_budget: bool = False) -> dict[str, torch.Tensor]:
        video = frames_tensor(frames)
        num_frames, _, height, width = video.shape
        if clip_budget and num_frames < self.temporal_patch_size:
            raise ValueError(
                f"Qwen3-VL video needs at least {self.temporal_patch_size} frames, got {num_frames} (sample more)"
            )
        new_h, new_w = self.frame_size(num_frames, height, width, clip_budget)
        video = resize_and_normalize(video, (new_h, new_w), self.image_mean, self.image_std, self.rescale_factor)
        if pad := -num_frames % self.temporal_patch_size:
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
