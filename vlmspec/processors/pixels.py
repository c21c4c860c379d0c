"""The pixel steps of `transformers`' video processors, with torch alone: resize, rescale, normalise.

Those processors resize uint8 frames with torchvision, which on CPU calls torch's own antialiased bicubic kernel for
uint8; rescale and normalise are fused into one subtraction and one division in float32. Doing the same operations
in the same order gives the same numbers without torchvision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F


def resize_and_normalize(
    frames: torch.Tensor,
    size: tuple[int, int],
    image_mean: Sequence[float],
    image_std: Sequence[float],
    rescale_factor: float = 1 / 255,
) -> torch.Tensor:
    """uint8 frames `(..., 3, H, W)` -> float32 frames `(..., 3, *size)`, rescaled and normalised."""
    mean = torch.tensor(image_mean) * (1.0 / rescale_factor)
    std = torch.tensor(image_std) * (1.0 / rescale_factor)
    return resize(frames, size).to(torch.float32).sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))


def resize(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bicubic antialiased resize of uint8 frames `(..., 3, H, W)` to `size`, as torchvision does it on CPU."""
    if tuple(frames.shape[-2:]) == tuple(size):
        return frames
    flat = frames.reshape(-1, *frames.shape[-3:]).contiguous()
    resized = F.interpolate(flat, size=list(size), mode="bicubic", align_corners=False, antialias=True)
    return resized.reshape(*frames.shape[:-2], *size)


def frames_tensor(frames: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Frames `(T, H, W, 3)` -> a contiguous uint8 tensor `(T, 3, H, W)`, checked."""
    video = torch.as_tensor(np.asarray(frames))
    if video.ndim != 4 or video.shape[-1] != 3:
        raise ValueError(f"expected frames of shape (T, H, W, 3), got {tuple(video.shape)}")
    return video.to(torch.uint8).permute(0, 3, 1, 2).contiguous()
