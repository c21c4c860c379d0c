"""Real media files written by the tests: images through PIL, videos through PyAV."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image

from vlmspec.testing.common import sample_image


def write_image(path: Path, size: tuple[int, int] = (60, 80), seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


def write_sample_images(folder: Path, count: int = 4) -> Path:
    """`folder`, made, holding `count` of the fixtures' sample images (`image0.png`, ...): a training data folder."""
    folder.mkdir()
    for i in range(count):
        sample_image(i).save(folder / f"image{i}.png")
    return folder


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


def write_audio_only(path: Path, seconds: float = 0.5) -> Path:
    """An mp4 holding one AAC audio stream of silence and no video stream."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        samples = 1024
        for k in range(int(seconds * 16000) // samples):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, samples), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, k * samples
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_zero_time_scale_video(path: Path, num_frames: int = 20) -> Path:
    """An mp4 whose media header states a time scale of 0 ticks a second, so it has no frame rate."""
    write_video(path, num_frames=num_frames)
    data = bytearray(path.read_bytes())
    header = data.find(b"mdhd")
    data[header + 16 : header + 20] = (0).to_bytes(4, "big")  # version, flags, creation and modification times first
    path.write_bytes(bytes(data))
    return path


def write_animated_gif(path: Path, levels: tuple[int, ...] = (40, 120, 200), size: tuple[int, int] = (40, 50)) -> Path:
    """A GIF of flat grey frames, one per level, the first of level `levels[0]`."""
    frames = [Image.fromarray(np.full((*size, 3), level, np.uint8)) for level in levels]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    return path


def write_rotated_jpeg(path: Path, size: tuple[int, int] = (40, 60), seed: int = 0) -> Path:
    """A JPEG stored sideways with EXIF orientation 6 (rotate 90 degrees clockwise to view), as phones write them."""
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    image.save(path, exif=exif)
    return path
