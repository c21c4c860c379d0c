"""Family-specific adapters and the registry that picks one for a model."""

from .base import ModelAdapter, Prefill, VideoProcessing, VisualLayout
from .registry import (
    adapter_class_for,
    adapter_class_for_family,
    adapter_for,
    register_adapter,
    supported_model_classes,
    unregister_adapter,
    video_processing,
)

__all__ = [
    "ModelAdapter",
    "Prefill",
    "VideoProcessing",
    "VisualLayout",
    "adapter_class_for",
    "adapter_class_for_family",
    "adapter_for",
    "register_adapter",
    "supported_model_classes",
    "unregister_adapter",
    "video_processing",
]
