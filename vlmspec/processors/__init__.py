"""Media in: turning images and video frames into what each model family expects."""

from .frame_sampling import EvenSampling, FrameSampling, QwenSampling, UniformSampling
from .inputs import VisualInputs, append_tokens, image_only
from .loading import load_processor, video_config
from .media import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    Video,
    frame_span,
    load_image,
    load_images,
    load_video,
    load_videos,
    media_kind,
    sample_indices,
)
from .prompt import IMAGE_MARKER, VIDEO_MARKER, chat_messages
from .qwen_video import QwenVideoPatcher
from .video_config import frame_sampling_for, video_packer_for
from .video_packing import LlavaOnevisionVideoPacker, QwenVideoPacker

__all__ = [
    "append_tokens",
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "IMAGE_MARKER",
    "VIDEO_MARKER",
    "EvenSampling",
    "FrameSampling",
    "LlavaOnevisionVideoPacker",
    "QwenSampling",
    "QwenVideoPacker",
    "QwenVideoPatcher",
    "UniformSampling",
    "Video",
    "VisualInputs",
    "chat_messages",
    "frame_sampling_for",
    "frame_span",
    "image_only",
    "load_image",
    "load_images",
    "load_processor",
    "load_video",
    "load_videos",
    "media_kind",
    "sample_indices",
    "video_config",
    "video_packer_for",
]
