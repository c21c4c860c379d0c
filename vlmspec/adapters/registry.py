"""Maps model classes to their adapters, so the engine never names a model family."""

from __future__ import annotations

from transformers import PreTrainedModel

from ..errors import UnsupportedModelError
from .base import ModelAdapter, VideoProcessing
from .llava_onevision import LlavaOnevisionAdapter
from .qwen2_5_vl import Qwen2_5_VLAdapter
from .qwen3_vl import Qwen3VLAdapter

_ADAPTERS: list[type[ModelAdapter]] = [Qwen2_5_VLAdapter, Qwen3VLAdapter, LlavaOnevisionAdapter]


def register_adapter(adapter: type[ModelAdapter]) -> type[ModelAdapter]:
    """Add an adapter class (usable as a decorator); later registrations win over earlier ones."""
    _ADAPTERS.insert(0, adapter)
    return adapter


def unregister_adapter(adapter: type[ModelAdapter]) -> None:
    """Take back a registration of `register_adapter` (the families it served fall to earlier registrations)."""
    _ADAPTERS.remove(adapter)


def video_processing() -> list[VideoProcessing]:
    """Every registered family's video processing, later registrations first."""
    return [adapter.video_processing for adapter in _ADAPTERS if adapter.video_processing is not None]


def adapter_class_for_family(family: VideoProcessing | None) -> type[ModelAdapter] | None:
    """The adapter class whose video processing is `family` (as `processors.video_config.family_for` finds it)."""
    if family is None:
        return None
    return next((adapter for adapter in _ADAPTERS if adapter.video_processing is family), None)


def supported_model_classes() -> list[str]:
    return sorted({name for adapter in _ADAPTERS for name in adapter.model_classes})


def adapter_class_for(model_class: type) -> type[ModelAdapter] | None:
    """The adapter class serving `model_class` (or one of its bases), if any."""
    names = {cls.__name__ for cls in model_class.__mro__}
    for adapter in _ADAPTERS:
        if names.intersection(adapter.model_classes):
            return adapter
    return None


def adapter_for(model: PreTrainedModel) -> ModelAdapter:
    """The adapter serving `model`'s class (or one of its bases); a clear error if there is none."""
    adapter = adapter_class_for(type(model))
    if adapter is not None:
        return adapter(model)
    raise UnsupportedModelError(
        f"vlmspec has no adapter for {type(model).__name__}; supported model classes: "
        + ", ".join(supported_model_classes())
    )
