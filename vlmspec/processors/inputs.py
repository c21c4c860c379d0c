"""Processor-like model inputs from chat text, images and video frames, for every family.

`transformers`' VLM processors cannot be built without torchvision (their video-processor slot needs it), as on
CPU-only torch installs. `image_only` gives the real processor class minus that slot, so text and images go
through `transformers` itself; video frames go through the family's packer in `video_packing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature, ProcessorMixin

from .media import Video, load_video


class VideoPacker(Protocol):
    """Turns one video into the model's tensors and the prompt text that replaces the template's `marker`."""

    marker: str

    def __call__(self, video: Video) -> tuple[dict[str, torch.Tensor], str]: ...

    def collate(self, packed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]: ...


@cache
def image_only(processor_class: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """The processor class without its video-processor slot (text and images behave exactly as in the original).

    Video placeholders in its text were expanded by a video packer, so the check that counts them against the
    videos passed ignores them.
    """

    class ImageOnly(processor_class):
        @classmethod
        def get_attributes(cls) -> list[str]:
            return [a for a in super().get_attributes() if a != "video_processor"]

        def validate_inputs(self, images=None, text=None, videos=None, audio=None, **kwargs):
            video_token = getattr(self, "video_token", None)
            if text is not None and videos is None and video_token:
                text = [t.replace(video_token, "") for t in ([text] if isinstance(text, str) else text)]
            return super().validate_inputs(images=images, text=text, videos=videos, audio=audio, **kwargs)

    ImageOnly.__name__ = processor_class.__name__
    ImageOnly.__qualname__ = f"image_only({processor_class.__name__})"
    return ImageOnly


class VisualInputs:
    """Callable like a processor: `(text, images=..., videos=...)` -> the model's keyword inputs, batch size 1.

    With no `video_packer` the processor handles videos itself (where torchvision is installed).
    """

    def __init__(self, processor: ProcessorMixin, video_packer: VideoPacker | None = None):
        self.processor = processor
        self.video_packer = video_packer

    def save_pretrained(self, path: str) -> None:
        self.processor.save_pretrained(path)

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.processor.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def __call__(
        self,
        text: str,
        images: Sequence[Image.Image] | None = None,
        videos: Sequence[Video | np.ndarray] | None = None,
        video_fps: float = 2.0,
    ) -> BatchFeature:
        """`videos` are `Video`s (frames with their source indices and frame rate) or frame arrays at `video_fps`."""
        videos = [load_video(v, source_fps=video_fps) for v in videos or []]
        video_inputs: dict[str, torch.Tensor] = {}
        if videos and self.video_packer is None:
            return self.processor(
                text=[text],
                images=list(images) if images else None,
                videos=[v.frames for v in videos],
                return_tensors="pt",
                fps=videos[0].sample_fps,
                do_sample_frames=False,
            )
        if videos:
            marker = self.video_packer.marker
            parts = text.split(marker)
            if len(parts) - 1 != len(videos):
                raise ValueError(
                    f"the prompt has {len(parts) - 1} video placeholders ({marker}) for {len(videos)} videos"
                )
            packed = [self.video_packer(v) for v in videos]
            placeholders = [placeholder for _, placeholder in packed]
            text = parts[0] + "".join(p + part for p, part in zip(placeholders, parts[1:], strict=True))
            video_inputs = self.video_packer.collate([tensors for tensors, _ in packed])
        inputs = self.processor(text=[text], images=list(images) if images else None, return_tensors="pt")
        inputs.update(video_inputs)
        return inputs
