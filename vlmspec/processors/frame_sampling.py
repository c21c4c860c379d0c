"""Which frames of a clip to decode: each model family's own rule, so the model sees the frames it was built for.

A rule maps a span of `total` frames at `native_fps` (and the user's `num_frames`, `fps`, `max_frames`, any of them
None) to the offsets, within the span, of the frames to take. Qwen families follow qwen-vl-utils' `smart_nframes`;
LLaVA-OneVision follows `transformers`' own video-processor sampler; `EvenSampling` is the rule when no model is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


class FrameSampling(Protocol):
    """Offsets (0 .. total - 1) of the frames to take from a span of `total` frames at `native_fps`."""

    def __call__(
        self, total: int, native_fps: float, num_frames: int | None, fps: float | None, max_frames: int | None
    ) -> np.ndarray: ...


def _spread(total: int, count: int) -> np.ndarray:
    """`count` offsets from the first to the last frame, evenly spaced and rounded (half to even)."""
    return np.linspace(0, total - 1, count).round().astype(np.int64)


@dataclass(frozen=True)
class EvenSampling:
    """`num_frames` evenly spread, or a frame every 1/`fps` seconds (default 2) capped at `max_frames` (default 64)."""

    fps: float = 2.0
    max_frames: int = 64

    def __call__(self, total, native_fps, num_frames, fps, max_frames) -> np.ndarray:
        if num_frames is None:
            step = native_fps / (self.fps if fps is None else fps)
            offsets = np.unique(np.round(np.arange(0, total, step)).astype(np.int64).clip(0, total - 1))
            cap = self.max_frames if max_frames is None else max_frames
            if len(offsets) <= cap:
                return offsets
            num_frames = cap
        return _spread(total, num_frames)


@dataclass(frozen=True)
class QwenSampling:
    """qwen-vl-utils' `smart_nframes`: `fps` frames a second, at least `min_frames`, at most `max_frames` and never more
    than the clip has, the count a multiple of `frame_factor`; a given `num_frames` is rounded to that factor too.
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    frame_factor: int = 2

    def count(self, total: int, native_fps: float, num_frames: int | None, fps: float | None, max_frames: int | None):
        """How many frames to take (at least one, and at least `frame_factor` where the clip has that many)."""
        factor = self.frame_factor
        if num_frames is not None:
            count = round(num_frames / factor) * factor
        else:
            cap = min(self.max_frames, total) if max_frames is None else max_frames
            low = math.ceil(self.min_frames / factor) * factor
            high = math.floor(cap / factor) * factor
            wanted = total / native_fps * (self.fps if fps is None else fps)
            count = math.floor(min(max(wanted, low), high, total) / factor) * factor
        return max(min(count, total - total % factor), min(factor, total))

    def __call__(self, total, native_fps, num_frames, fps, max_frames) -> np.ndarray:
        count = self.count(total, native_fps, num_frames, fps, max_frames)
        return torch.linspace(0, total - 1, count).round().long().numpy()  # float32, as qwen-vl-utils spreads them


@dataclass(frozen=True)
class UniformSampling:
    """`transformers`' default video-processor sampler: `n` frames at offsets `i * total // n`, `n` from `num_frames` or
    `fps` (the user's, else the checkpoint's); with neither, every frame. `max_frames` caps `n`; `n` never exceeds the
    clip.
    """

    num_frames: int | None = None
    fps: float | None = None

    def __call__(self, total, native_fps, num_frames, fps, max_frames) -> np.ndarray:
        if num_frames is None and fps is None:
            num_frames, fps = self.num_frames, self.fps
        if num_frames is None and fps is not None:
            num_frames = max(1, int(total / native_fps * fps))
        count = total if num_frames is None else min(num_frames, total)
        if max_frames is not None:
            count = min(count, max_frames)
        return np.arange(count, dtype=np.int64) * total // count
