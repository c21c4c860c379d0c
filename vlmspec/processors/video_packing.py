"""Per-family video packing: decoded frames -> the model's video tensors and the prompt text that stands for them.

Each packer reproduces its family's `transformers` 5.23 video processor and the processor's prompt expansion (which
need torchvision): the text it returns replaces one video token (`marker`) of the chat template's output, and it
knows the family's frame-sampling rule and the video processor config that describes it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from .frame_sampling import QwenSampling, UniformSampling
from .media import Video
from .pixels import frames_tensor, resize_and_normalize
from .qwen_video import QwenVideoPatcher

#: The pixel steps every family's video processor takes, as its config states them (resample 3: PIL's bicubic).
_PIXEL_STEPS = dict(resample=3, do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True)


class QwenVideoPacker:
    """Qwen2.5-VL (one block of video tokens, seconds per temporal grid) or, with `timestamps`, Qwen3-VL (one pixel
    budget for the whole clip, a `<t seconds>` block per temporal grid inside the template's vision start/end).
    """

    marker = "<|video_pad|>"
    _start, _end = "<|vision_start|>", "<|vision_end|>"

    def __init__(self, patcher: QwenVideoPatcher, timestamps: bool, sampling: QwenSampling | None = None):
        self.patcher = patcher
        self.timestamps = timestamps
        self.sampling = QwenSampling() if sampling is None else sampling

    @property
    def min_frames(self) -> int:
        """Qwen3-VL's processor refuses clips shorter than its temporal patch; Qwen2.5-VL's pads them itself."""
        return self.patcher.temporal_patch_size if self.timestamps else 1

    def __call__(self, video: Video) -> tuple[dict[str, torch.Tensor], str]:
        out = self.patcher(video.frames, clip_budget=self.timestamps)
        grid_t, grid_h, grid_w = out["video_grid_thw"][0].tolist()
        per_frame = grid_h * grid_w // self.patcher.merge_size**2
        if not self.timestamps:
            out["second_per_grid_ts"] = torch.tensor([self.patcher.temporal_patch_size / video.sample_fps])
            return out, self.marker * (per_frame * grid_t)
        block = self._start + self.marker * per_frame + self._end
        return out, "".join(f"<{seconds:.1f} seconds>{block}" for seconds in self.grid_seconds(video))

    def grid_seconds(self, video: Video) -> list[float]:
        """Seconds of each temporal grid: the mean time of its first and last frame (the last repeats as padding)."""
        step = self.patcher.temporal_patch_size
        indices = video.indices.tolist()
        indices += [indices[-1]] * (-len(indices) % step)
        return [(indices[i] / video.fps + indices[i + step - 1] / video.fps) / 2 for i in range(0, len(indices), step)]

    def video_processor_config(self) -> dict[str, Any]:
        """The `video_preprocessor_config.json` that makes `transformers` process video as this packer does."""
        p, s = self.patcher, self.sampling
        config = {
            "video_processor_type": "Qwen3VLVideoProcessor" if self.timestamps else "Qwen2VLVideoProcessor",
            "size": {"shortest_edge": p.min_pixels, "longest_edge": p.max_pixels},
            "patch_size": p.patch_size,
            "temporal_patch_size": p.temporal_patch_size,
            "merge_size": p.merge_size,
            "image_mean": list(p.image_mean),
            "image_std": list(p.image_std),
            "rescale_factor": p.rescale_factor,
            **_PIXEL_STEPS,
            "cap_pixels_per_frame": p.cap_pixels_per_frame,
            "fps": s.fps,
            "min_frames": s.min_frames,
            "max_frames": s.max_frames,
        }
        if p.max_video_tokens is not None:
            config["max_video_tokens"] = p.max_video_tokens
        return config

    @staticmethod
    def collate(packed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {key: torch.cat([p[key] for p in packed]) for key in packed[0]}


class LlavaOnevisionVideoPacker:
    """LLaVA-OneVision: every frame resized to the vision tower's input size; 2x2-pooled tokens plus one newline."""

    marker = "<video>"
    min_frames = 1

    def __init__(
        self,
        size: int | tuple[int, int],
        image_mean: Sequence[float],
        image_std: Sequence[float],
        num_image_tokens: int,
        sampling: UniformSampling | None = None,
        rescale_factor: float = 1 / 255,
    ):
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.image_mean, self.image_std = tuple(image_mean), tuple(image_std)
        self.rescale_factor = rescale_factor
        self.num_image_tokens = num_image_tokens
        self.sampling = UniformSampling() if sampling is None else sampling

    def __call__(self, video: Video) -> tuple[dict[str, torch.Tensor], str]:
        frames = resize_and_normalize(
            frames_tensor(video.frames), self.size, self.image_mean, self.image_std, self.rescale_factor
        )
        pooled = math.ceil(int(math.sqrt(self.num_image_tokens)) / 2)
        return {"pixel_values_videos": frames[None]}, self.marker * (frames.shape[0] * pooled * pooled + 1)

    def video_processor_config(self) -> dict[str, Any]:
        """The `video_preprocessor_config.json` that makes `transformers` process video as this packer does."""
        config = {
            "video_processor_type": "LlavaOnevisionVideoProcessor",
            "size": {"height": self.size[0], "width": self.size[1]},
            "image_mean": list(self.image_mean),
            "image_std": list(self.image_std),
            "rescale_factor": self.rescale_factor,
            **_PIXEL_STEPS,
        }
        config.update({k: v for k, v in dataclasses.asdict(self.sampling).items() if v is not None})
        return config

    @staticmethod
    def collate(packed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {"pixel_values_videos": torch.cat([p["pixel_values_videos"] for p in packed])}
