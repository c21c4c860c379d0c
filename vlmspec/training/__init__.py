"""Training a draft to agree with its target (`vlmspec train-draft`)."""

from .trainer import TrainSettings, train_draft
from .vsd import VSDConfig

__all__ = ["TrainSettings", "VSDConfig", "train_draft"]
