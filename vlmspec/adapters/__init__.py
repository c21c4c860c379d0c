"""Family-specific adapters and the registry that picks one for a model."""

from .base import ModelAdapter, Prefill, VisualLayout
from .registry import adapter_class_for, adapter_for, register_adapter, supported_model_classes

__all__ = [
    "ModelAdapter",
    "Prefill",
    "VisualLayout",
    "adapter_class_for",
    "adapter_for",
    "register_adapter",
    "supported_model_classes",
]
