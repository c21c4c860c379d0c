"""Per-family video processor settings as `transformers` 5.23 reads them, and the packer and frame rule they give.

A checkpoint's video processor config only states what differs from its class's defaults; the defaults below are
those classes' (`Qwen2VLVideoProcessor`, `Qwen3VLVideoProcessor`, `LlavaOnevisionVideoProcessor`), so the same
config gives the same settings with or without torchvision.
"""

from __future__ import annotations

from typing import Any

from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from .frame_sampling import EvenSampling, FrameSampling, QwenSampling, UniformSampling
from .qwen_video import QwenVideoPatcher
from .video_packing import LlavaOnevisionVideoPacker, QwenVideoPacker

#: The video processor class each processor class loads.
VIDEO_PROCESSOR_TYPES = {
    "Qwen2VLProcessor": "Qwen2VLVideoProcessor",
    "Qwen2_5_VLProcessor": "Qwen2VLVideoProcessor",
    "Qwen3VLProcessor": "Qwen3VLVideoProcessor",
    "LlavaOnevisionProcessor": "LlavaOnevisionVideoProcessor",
}

_COMMON = dict(rescale_factor=1 / 255, num_frames=None, fps=None)
_QWEN = dict(temporal_patch_size=2, merge_size=2, min_frames=4, max_frames=768, cap_pixels_per_frame=None)
_DEFAULTS = {
    "Qwen2VLVideoProcessor": dict(
        _QWEN,
        size={"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        patch_size=14,
    ),
    "Qwen3VLVideoProcessor": dict(
        _QWEN,
        size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
        image_mean=IMAGENET_STANDARD_MEAN,
        image_std=IMAGENET_STANDARD_STD,
        patch_size=16,
        fps=2,
    ),
    "LlavaOnevisionVideoProcessor": dict(
        size={"height": 384, "width": 384}, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD
    ),
}


def video_settings(processor_name: str, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The video processor class `config` loads as for a `processor_name` processor, and its full settings."""
    kind = config.get("video_processor_type") or VIDEO_PROCESSOR_TYPES.get(processor_name)
    if kind not in _DEFAULTS:
        raise ValueError(f"vlmspec has no video packing for {processor_name} (video processor {kind})")
    settings = {**_COMMON, **_DEFAULTS[kind], **{k: v for k, v in config.items() if v is not None}}
    if kind == "Qwen2VLVideoProcessor":
        size = dict(settings["size"])
        size["shortest_edge"] = settings.get("min_pixels", size["shortest_edge"])
        size["longest_edge"] = settings.get("max_pixels", size["longest_edge"])
        settings["size"] = size
    return kind, settings


def frame_sampling_for(processor_name: str, config: dict[str, Any]) -> FrameSampling:
    """The family's frame-sampling rule, with the checkpoint's own frame settings; `EvenSampling` for other models."""
    if VIDEO_PROCESSOR_TYPES.get(processor_name) is None and "video_processor_type" not in config:
        return EvenSampling()
    kind, s = video_settings(processor_name, config)
    if kind == "LlavaOnevisionVideoProcessor":
        return UniformSampling(num_frames=s["num_frames"], fps=s["fps"])
    return QwenSampling(fps=s["fps"] or QwenSampling.fps, min_frames=s["min_frames"], max_frames=s["max_frames"])


def video_packer_for(
    processor: Any, video_config: dict[str, Any] | None = None
) -> QwenVideoPacker | LlavaOnevisionVideoPacker:
    """The video packer for `processor`'s family, set up by its video processor config (without one, by its image
    processor's, as `transformers` falls back to `preprocessor_config.json`).
    """
    name = type(processor).__name__
    config = processor.image_processor.to_dict() if video_config is None else video_config
    kind, s = video_settings(name, config)
    mean, std, rescale = tuple(s["image_mean"]), tuple(s["image_std"]), s["rescale_factor"]
    sampling = frame_sampling_for(name, config)
    if kind == "LlavaOnevisionVideoProcessor":
        size = (s["size"]["height"], s["size"]["width"])
        return LlavaOnevisionVideoPacker(size, mean, std, processor.num_image_tokens, sampling, rescale)
    patcher = QwenVideoPatcher(
        patch_size=s["patch_size"],
        temporal_patch_size=s["temporal_patch_size"],
        merge_size=s["merge_size"],
        min_pixels=s["size"]["shortest_edge"],
        max_pixels=s["size"]["longest_edge"],
        image_mean=mean,
        image_std=std,
        rescale_factor=rescale,
        cap_pixels_per_frame=bool(s["cap_pixels_per_frame"]),
        max_video_tokens=s.get("max_video_tokens"),
    )
    return QwenVideoPacker(patcher, timestamps=kind == "Qwen3VLVideoProcessor", sampling=sampling)
