"""Processor-like model inputs from chat text, images and video frames, for every family.

`transformers`' VLM processors cannot be built without torchvision (their video-processor slot needs it), as on
CPU-only torch installs. `image_only` gives the real processor class minus that slot, so text and images go
through `transformers` itself; video frames go through the family's packer in `video_packing`. Either way the frames
are sampled by the family's rule and reach the processor with their real metadata.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image
from transformers import BatchFeature, ProcessorMixin

from ..adapters import adapter_class_for_family
from ..errors import MediaRejectedError, VLMSpecError
from .frame_sampling import FrameSampling
from .media import Video, load_video
from .prompt import chat_messages
from .video_config import family_for, frame_sampling_for

VIDEO_CONFIG_NAME = "video_preprocessor_config.json"
#: A video as `VisualInputs` takes it: frames with their metadata, a path, or a frame array `(T, H, W, 3)`.
VideoLike = Video | np.ndarray | str | os.PathLike


class VideoPacker(Protocol):
    """Turns one video into the model's tensors and the prompt text that replaces one `marker` (the video token)."""

    marker: str
    sampling: FrameSampling
    min_frames: int

    def __call__(self, video: Video) -> tuple[dict[str, torch.Tensor], str]: ...

    def collate(self, packed: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]: ...

    def video_processor_config(self) -> dict[str, Any]: ...


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
    """Callable like a processor: `(text, images=..., videos=...)` -> the model's keyword inputs, batch size 1 (or
    a left-padded batch for a list of prompts).

    With no `video_packer` the processor handles videos itself (where torchvision is installed).
    """

    def __init__(self, processor: ProcessorMixin, video_packer: VideoPacker | None = None):
        self.processor = processor
        self.video_packer = video_packer

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """The processor's files; with a packer, also the video processor config `AutoProcessor` needs to load it."""
        self.processor.save_pretrained(path)
        if self.video_packer is not None:
            config = {**self.video_packer.video_processor_config(), "processor_class": type(self.processor).__name__}
            (Path(path) / VIDEO_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    @property
    def frame_sampling(self) -> FrameSampling:
        """The family's rule for which frames of a clip to decode (pass it to `load_video` as `sampling`)."""
        if self.video_packer is not None:
            return self.video_packer.sampling
        video_processor = getattr(self.processor, "video_processor", None)
        config = video_processor.to_dict() if video_processor is not None else {}
        return frame_sampling_for(type(self.processor).__name__, config)

    @property
    def min_video_frames(self) -> int:
        """The fewest frames the family's video processor takes (Qwen3-VL: its temporal patch); shorter clips are
        padded by repeating their last frame, as that processor pads a clip of an odd frame count."""
        if self.video_packer is not None:
            return self.video_packer.min_frames
        video_processor = getattr(self.processor, "video_processor", None)
        config = video_processor.to_dict() if video_processor is not None else {}
        family = family_for(type(self.processor).__name__, config)
        if family is not None and family.whole_temporal_patch:
            return video_processor.temporal_patch_size
        return 1

    @property
    def tokenizer(self) -> Any:
        return self.processor.tokenizer

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return self.processor.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def __call__(
        self,
        text: str | list[str],
        images: Sequence[Image.Image] | Sequence[Sequence[Image.Image]] | None = None,
        videos: Sequence[VideoLike] | Sequence[Sequence[VideoLike]] | None = None,
        video_fps: float = 2.0,
    ) -> BatchFeature:
        """`videos` are `Video`s (frames with their metadata), paths (sampled by the family's rule) or frame arrays at
        `video_fps`.

        For a list of prompts `images` and `videos` hold one list per prompt, and the result is the left-padded batch
        the family's processor makes for the list, `(B, L)` token inputs plus every prompt's media (each row what the
        prompt alone gives; `ModelAdapter.split_rows` takes it apart).
        """
        if isinstance(text, str):
            return self._prompt(text, images, videos, video_fps)
        images = [[] for _ in text] if images is None else [list(row) for row in images]
        videos = [[] for _ in text] if videos is None else [list(row) for row in videos]
        if not len(text) == len(images) == len(videos):
            raise ValueError(f"{len(text)} prompts need one list of images and one list of videos each")
        if self.video_packer is not None:
            rows = [self._prompt(t, i, v, video_fps) for t, i, v in zip(text, images, videos, strict=True)]
            name = type(self.processor).__name__
            adapter = adapter_class_for_family(family_for(name, self.video_packer.video_processor_config()))
            if adapter is None:
                raise ValueError(f"vlmspec cannot batch prompts for {name}: no registered adapter packs its video")
            return BatchFeature(adapter.join_rows(rows, self.tokenizer.pad_token_id))
        flat_images = [image for row in images for image in row]
        flat_videos = [video for row in videos for video in self._load_videos(row, video_fps)]
        video_kwargs = dict(
            videos=[v.frames for v in flat_videos],
            video_metadata=[v.metadata for v in flat_videos],
            do_sample_frames=False,
        )
        return self.processor(
            text=list(text),
            images=flat_images or None,
            **(video_kwargs if flat_videos else {}),
            padding=True,
            padding_side="left",
            return_tensors="pt",
        )

    def _load_videos(self, videos: Sequence[VideoLike], video_fps: float) -> list[Video]:
        """The videos' frames, sampled by the family's rule and padded to the fewest frames it takes."""
        sampling = self.frame_sampling if videos else None
        minimum = self.min_video_frames if videos else 1
        return [load_video(v, source_fps=video_fps, sampling=sampling).padded(minimum) for v in videos]

    def _prompt(
        self, text: str, images: Sequence[Image.Image] | None, videos: Sequence[VideoLike] | None, video_fps: float
    ) -> BatchFeature:
        """One prompt's inputs, batch size 1."""
        videos = self._load_videos(videos or [], video_fps)
        video_inputs: dict[str, torch.Tensor] = {}
        if videos and self.video_packer is None:
            return self.processor(
                text=[text],
                images=list(images) if images else None,
                videos=[v.frames for v in videos],
                video_metadata=[v.metadata for v in videos],
                do_sample_frames=False,
                return_tensors="pt",
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

    def prompt_inputs(
        self,
        prompt: str,
        images: Sequence[Image.Image] = (),
        videos: Sequence[Video] = (),
        names: Sequence[str] | None = None,
    ) -> BatchFeature:
        """The model inputs for a plain prompt (placed by `chat_messages`) and its media. A medium the processor
        refuses raises `MediaRejectedError` naming it (`names`: one per image, then one per video)."""
        text = self.apply_chat_template(chat_messages(prompt, len(images), len(videos)))
        try:
            return self(text, images=images, videos=videos)
        except VLMSpecError:
            raise
        except ValueError as error:
            refused = self._refused(images, videos, names)
            if refused is None:
                raise
            raise MediaRejectedError(
                f"{refused}: the model's processor refuses it ({error}); crop, pad or resize it to what it takes"
            ) from error

    def _refused(
        self, images: Sequence[Image.Image], videos: Sequence[Video], names: Sequence[str] | None
    ) -> str | None:
        """The name of the first medium the processor refuses on its own (None: the media are not at fault)."""
        media = [([m], []) for m in images] + [([], [m]) for m in videos]
        if names is None:
            names = [f"images[{i}]" for i in range(len(images))] + [f"videos[{i}]" for i in range(len(videos))]
        for (image, video), name in zip(media, names, strict=True):
            text = self.apply_chat_template(chat_messages("Describe it.", len(image), len(video)))
            try:
                self(text, images=image, videos=video)
            except ValueError:
                return name
        return None


def append_tokens(inputs: dict[str, Any], tokens: torch.Tensor) -> dict[str, Any]:
    """Processor outputs for one prompt `(1, L)` with text `tokens` `(n,)` appended: the ids, the attention mask (ones)
    and the token types (text)."""
    ids = inputs["input_ids"]
    tail = tokens.to(dtype=ids.dtype, device=ids.device)[None]
    extended = dict(inputs, input_ids=torch.cat([ids, tail], dim=1))
    if inputs.get("attention_mask") is not None:
        mask = inputs["attention_mask"]
        extended["attention_mask"] = torch.cat([mask, torch.ones_like(tail, dtype=mask.dtype)], dim=1)
    if inputs.get("mm_token_type_ids") is not None:
        types = inputs["mm_token_type_ids"]
        extended["mm_token_type_ids"] = torch.cat([types, torch.zeros_like(tail, dtype=types.dtype)], dim=1)
    return extended
