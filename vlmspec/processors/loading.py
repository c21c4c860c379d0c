"""Loading a model's processor from the hub or a directory, with or without torchvision."""

from __future__ import annotations

import json
from typing import Any

import transformers
from transformers import AutoConfig, AutoProcessor
from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
from transformers.utils import cached_file, is_torchvision_available

from .inputs import VIDEO_CONFIG_NAME, VisualInputs, image_only
from .video_config import video_packer_for


def load_processor(path: str, **hub_kwargs: Any) -> VisualInputs:
    """The model's own processor; without torchvision, its image-only form plus vlmspec's video packer."""
    if is_torchvision_available():
        return VisualInputs(AutoProcessor.from_pretrained(path, **hub_kwargs))
    model_type = AutoConfig.from_pretrained(path, **hub_kwargs).model_type
    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ValueError(f"no processor class is known for {path} (model type {model_type!r})")
    processor = image_only(getattr(transformers, name)).from_pretrained(path, **hub_kwargs)
    return VisualInputs(processor, video_packer_for(processor, video_config(path, **hub_kwargs)))


def video_config(path: str, **hub_kwargs: Any) -> dict[str, Any] | None:
    """The saved video processor settings, found where `transformers` looks: nested in `processor_config.json`, else
    `video_preprocessor_config.json`, else `preprocessor_config.json`; None when the checkpoint has none of them.
    """
    nested = _json(path, "processor_config.json", **hub_kwargs)
    if nested is not None and "video_processor" in nested:
        return nested["video_processor"]
    for name in (VIDEO_CONFIG_NAME, "preprocessor_config.json"):
        if (config := _json(path, name, **hub_kwargs)) is not None:
            return config
    return None


def _json(path: str, name: str, **hub_kwargs: Any) -> dict[str, Any] | None:
    resolved = cached_file(path, name, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
    if resolved is None:
        return None
    with open(resolved) as f:
        return json.load(f)
