"""Media in: turning images and video frames into what each model family expects."""

from .inputs import VisualInputs, image_only
from .loading import load_processor, video_packer_for
from .media import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    Video,
    load_image,
    load_images,
    load_video,
    load_videos,
    media_kind,
    sample_indices,
)
from .prompt import IMAGE_MARKER, VIDEO_MARKER, chat_messages
from .qwen_video import QwenVideoPatcher
from .video_packing import LlavaOnevisionVideoPacker, QwenVideoPacker

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "IMAGE_MARKER",
    "VIDEO_MARKER",
    "LlavaOnevisionVideoPacker",
    "QwenVideoPacker",
    "QwenVideoPatcher",
    "Video",
    "VisualInputs",
    "chat_messages",
    "image_only",
    "load_image",
    "load_images",
    "load_processor",
    "load_video",
    "load_videos",
    "media_kind",
    "sample_indices",
    "video_packer_for",
]
