"""Loading a model's processor from the hub or a directory, with or without torchvision."""

from __future__ import annotations

import json
from typing import Any

import transformers
from transformers import AutoConfig, AutoProcessor
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.utils import cached_file, is_torchvision_available

from .inputs import VideoPacker, VisualInputs, image_only
from .qwen_video import QwenVideoPatcher
from .video_packing import LlavaOnevisionVideoPacker, QwenVideoPacker

_QWEN_TIMESTAMPED = {"Qwen2VLProcessor": False, "Qwen2_5_VLProcessor": False, "Qwen3VLProcessor": True}


def load_processor(path: str, **hub_kwargs: Any) -> VisualInputs:
    """The model's own processor; without torchvision, its image-only form plus vlmspec's video packer."""
    if is_torchvision_available():
        return VisualInputs(AutoProcessor.from_pretrained(path, **hub_kwargs))
    model_type = AutoConfig.from_pretrained(path, **hub_kwargs).model_type
    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ValueError(f"no processor class is known for {path} (model type {model_type!r})")
    processor = image_only(getattr(transformers, name)).from_pretrained(path, **hub_kwargs)
    return VisualInputs(processor, video_packer_for(processor, _video_config(path, **hub_kwargs)))


def video_packer_for(processor: Any, video_config: dict[str, Any] | None = None) -> VideoPacker:
    """The video packer matching `processor`'s family, sized like its saved video processor (or its image processor)."""
    name = type(processor).__name__
    image_processor = processor.image_processor
    video_config = video_config or {}
    if name in _QWEN_TIMESTAMPED:
        size = video_config.get("size") or {}
        patcher = QwenVideoPatcher(
            patch_size=video_config.get("patch_size", image_processor.patch_size),
            temporal_patch_size=video_config.get("temporal_patch_size", image_processor.temporal_patch_size),
            merge_size=video_config.get("merge_size", image_processor.merge_size),
            min_pixels=size.get("shortest_edge", image_processor.size["shortest_edge"]),
            max_pixels=size.get("longest_edge", image_processor.size["longest_edge"]),
            image_mean=tuple(video_config.get("image_mean", image_processor.image_mean)),
            image_std=tuple(video_config.get("image_std", image_processor.image_std)),
        )
        return QwenVideoPacker(patcher, timestamps=_QWEN_TIMESTAMPED[name])
    if name == "LlavaOnevisionProcessor":
        size = video_config.get("size") or image_processor.size
        return LlavaOnevisionVideoPacker(
            size["height"],
            video_config.get("image_mean", image_processor.image_mean),
            video_config.get("image_std", image_processor.image_std),
            processor.num_image_tokens,
        )
    raise ValueError(f"vlmspec has no video packing for {name}")


def _video_config(path: str, **hub_kwargs: Any) -> dict[str, Any] | None:
    """The saved video processor settings, when the checkpoint has them."""
    resolved = cached_file(
        path, "video_preprocessor_config.json", _raise_exceptions_for_missing_entries=False, **hub_kwargs
    )
    if resolved is None:
        return None
    with open(resolved) as f:
        return json.load(f)
