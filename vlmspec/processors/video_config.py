"""Video processor settings as `transformers` 5.23 reads them, and the packer and frame rule they give.

Each family's adapter states its video processing (`ModelAdapter.video_processing`): the processor classes that
load its video processor class, that class's defaults (a checkpoint's video processor config only states what
differs), its packer and its frame rule; so the same config gives the same settings with or without torchvision,
and a new family brings its own in its adapter file.
"""

from __future__ import annotations

from typing import Any

from ..adapters import VideoProcessing, video_processing
from .frame_sampling import EvenSampling, FrameSampling, QwenSampling, UniformSampling
from .qwen_video import QwenVideoPatcher
from .video_packing import LlavaOnevisionVideoPacker, QwenVideoPacker

_COMMON = dict(rescale_factor=1 / 255, num_frames=None, fps=None)


def family_for(processor_name: str, config: dict[str, Any]) -> VideoProcessing | None:
    """The video processing of the family whose video processor `config` loads for a `processor_name` processor."""
    kind = config.get("video_processor_type")
    for family in video_processing():
        if family.video_processor == kind or (kind is None and processor_name in family.processor_classes):
            return family
    return None


def video_settings(processor_name: str, config: dict[str, Any]) -> tuple[VideoProcessing, dict[str, Any]]:
    """The video processing `config` loads as for a `processor_name` processor, and its full settings."""
    family = family_for(processor_name, config)
    if family is None:
        kind = config.get("video_processor_type")
        raise ValueError(f"vlmspec has no video packing for {processor_name} (video processor {kind})")
    settings = {**_COMMON, **family.defaults, **{k: v for k, v in config.items() if v is not None}}
    if family.pixel_bounds:
        size = dict(settings["size"])
        size["shortest_edge"] = settings.get("min_pixels", size["shortest_edge"])
        size["longest_edge"] = settings.get("max_pixels", size["longest_edge"])
        settings["size"] = size
    return family, settings


def frame_sampling_for(processor_name: str, config: dict[str, Any]) -> FrameSampling:
    """The family's frame-sampling rule, with the checkpoint's own frame settings; `EvenSampling` for other models."""
    if family_for(processor_name, config) is None:
        return EvenSampling()
    family, s = video_settings(processor_name, config)
    if family.sampling == "uniform":
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
    family, s = video_settings(name, config)
    mean, std, rescale = tuple(s["image_mean"]), tuple(s["image_std"]), s["rescale_factor"]
    sampling = frame_sampling_for(name, config)
    if family.packing == "pooled-frames":
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
    return QwenVideoPacker(patcher, timestamps=family.timestamps, sampling=sampling)
