"""Chat messages from a plain prompt: where the images and videos go, checked against the media given.

A prompt may place media itself with `<image>` and `<video>` markers (one per image or video, in order);
without markers, images come first, then videos, then the text. Each family's chat template then writes its
own visual placeholders.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import EmptyPromptError, PlaceholderMismatchError

IMAGE_MARKER = "<image>"
VIDEO_MARKER = "<video>"
_MARKERS = re.compile(f"({re.escape(IMAGE_MARKER)}|{re.escape(VIDEO_MARKER)})")


def chat_messages(prompt: str, num_images: int = 0, num_videos: int = 0) -> list[dict[str, Any]]:
    """One user turn holding the prompt's text and one entry per image and video."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise EmptyPromptError(f"the prompt is empty: {prompt!r}")
    parts = [p for p in _MARKERS.split(prompt) if p]
    images, videos = parts.count(IMAGE_MARKER), parts.count(VIDEO_MARKER)
    if images or videos:
        if images != num_images or videos != num_videos:
            raise PlaceholderMismatchError(
                f"the prompt places {images} {IMAGE_MARKER} and {videos} {VIDEO_MARKER} but {num_images} images and "
                f"{num_videos} videos were given"
            )
        content = [
            {"type": "image"}
            if p == IMAGE_MARKER
            else {"type": "video"}
            if p == VIDEO_MARKER
            else {"type": "text", "text": p}
            for p in parts
        ]
        if not any(c["type"] == "text" and c["text"].strip() for c in content):
            raise EmptyPromptError(f"the prompt has placeholders but no text: {prompt!r}")
    else:
        content = [{"type": "image"}] * num_images + [{"type": "video"}] * num_videos
        content = [dict(c) for c in content] + [{"type": "text", "text": prompt}]
    return [{"role": "user", "content": content}]
