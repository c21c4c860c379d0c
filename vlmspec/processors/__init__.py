"""Media in: turning images and video frames into what each model family expects."""

from .inputs import VisualInputs, image_only
from .loading import load_processor, video_packer_for
from .qwen_video import QwenVideoPatcher
from .video_packing import LlavaOnevisionVideoPacker, QwenVideoPacker

__all__ = [
    "LlavaOnevisionVideoPacker",
    "QwenVideoPacker",
    "QwenVideoPatcher",
    "VisualInputs",
    "image_only",
    "load_processor",
    "video_packer_for",
]
