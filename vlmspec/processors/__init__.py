"""Media in: turning images and video frames into what each model family expects."""

from .qwen import QwenVLInputs
from .qwen_video import QwenVideoPatcher

__all__ = ["QwenVLInputs", "QwenVideoPatcher"]
