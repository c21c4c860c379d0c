"""Real media files written by the tests: images through PIL, videos through PyAV."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image


def write_image(path: Path, size: tuple[int, int] = (60, 80), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


def write_video(path: Path, num_frames: int = 30, fps: int = 10, size: tuple[int, int] = (48, 64)) -> Path:
    """An mp4 whose frame i is a flat grey of level 8 * i, so decoded frames reveal their index."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.height, stream.width = size
        stream.pix_fmt = "yuv420p"
        for i in range(num_frames):
            frame = av.VideoFrame.from_ndarray(np.full((*size, 3), 8 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_empty_video(path: Path) -> Path:
    """An mp4 container that declares a video stream but holds no frames."""
    container = av.open(str(path), "w")
    stream = container.add_stream("mpeg4", rate=10)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    container.start_encoding()
    container.close()
    return path
