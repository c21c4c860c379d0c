"""Images and videos in: paths, URLs, PIL images, arrays, tensors and frame lists, with clear errors.

Videos are decoded with decord and sampled by a frame-sampling rule (the model family's, see `frame_sampling`) from
`num_frames`, or a rate `fps` capped by `max_frames`, optionally between `start` and `end` seconds. The sampled frame
indices, the span they were drawn from and the native frame rate travel with the frames as the video's metadata, so
the processors are told the real time (Qwen2.5-VL's seconds per grid, Qwen3-VL's timestamps).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from transformers.image_transforms import convert_to_rgb
from transformers.video_utils import VideoMetadata

from ..errors import MediaNotFoundError, NoFramesError, NotAnImageError, UnreadableVideoError, UnsupportedMediaError
from .checks import check_frame_request, shown_value
from .frame_sampling import EvenSampling, FrameSampling

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"})
VIDEO_EXTENSIONS = frozenset({".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".mpeg", ".mpg", ".flv", ".wmv"})

#: Frame rate assumed for frames that come without one (arrays, frame lists, files that do not state it).
DEFAULT_FPS = 2.0
#: Below this a container's frame rate comes from a zero or broken time base, not from a real clip.
MIN_NATIVE_FPS = 0.01


@dataclass
class Video:
    """Decoded frames `(T, H, W, 3)` uint8, the source frame index of each, and the source's frame rate.

    `total_frames` is the length of the span the frames were sampled from (the whole clip, or the frames between
    `start` and `end`); by default the span the indices cover.
    """

    frames: np.ndarray
    indices: np.ndarray
    fps: float
    source: str = "<frames>"
    total_frames: int | None = None

    def __post_init__(self) -> None:
        self.indices = np.asarray(self.indices, dtype=np.int64)
        if self.total_frames is None:
            self.total_frames = int(self.indices.max() - self.indices.min()) + 1

    def padded(self, min_frames: int) -> Video:
        """The clip with its last frame repeated up to `min_frames` frames (a family whose processor refuses shorter
        clips, Qwen3-VL's with fewer frames than its temporal patch, pads them this way itself when the count is odd).
        """
        missing = min_frames - len(self.frames)
        if missing <= 0:
            return self
        frames = np.concatenate([self.frames, np.repeat(self.frames[-1:], missing, axis=0)])
        indices = np.concatenate([self.indices, np.repeat(self.indices[-1:], missing)])
        return Video(frames, indices, self.fps, self.source, self.total_frames)

    @property
    def timestamps(self) -> np.ndarray:
        """Seconds from the start of the source for each frame."""
        return self.indices / self.fps

    @property
    def sample_fps(self) -> float:
        """Frames per second of the sampled sequence, as `transformers`' `VideoMetadata.sampled_fps` counts it."""
        return len(self.indices) / self.total_frames * self.fps

    @property
    def metadata(self) -> VideoMetadata:
        """What `transformers`' video processors need to know of the clip: its rate, span and the frames taken."""
        height, width = self.frames.shape[1:3]
        return VideoMetadata(
            total_num_frames=self.total_frames,
            fps=self.fps,
            width=width,
            height=height,
            duration=self.total_frames / self.fps,
            frames_indices=self.indices.tolist(),
        )


def media_kind(path: str | os.PathLike) -> str:
    """`"image"` or `"video"` from the file extension; a clear error for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix in IMAGE_EXTENSIONS:
        return "image"
    if suffix in VIDEO_EXTENSIONS:
        return "video"
    raise UnsupportedMediaError(
        f"{path}: unsupported file type {suffix or '(no extension)'}; images: {', '.join(sorted(IMAGE_EXTENSIONS))}; "
        f"videos: {', '.join(sorted(VIDEO_EXTENSIONS))}"
    )


def _existing(path: str | os.PathLike) -> str:
    if not os.path.exists(path):
        raise MediaNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise UnsupportedMediaError(f"{path}: a folder, not an image or video file (`vlmspec caption` takes folders)")
    return str(path)


def load_image(source: Any) -> Image.Image:
    """An RGB PIL image from a path, an http(s) URL, a file's bytes, a PIL image, an (H, W, C) array or a (C, H, W)
    tensor.

    Converted as `transformers` converts: files turned upright by their EXIF orientation, then any mode (CMYK,
    palette, grey, with or without alpha) to RGB with transparency composited onto white, as its image processors
    do; the first frame of an animated file. One conversion is vlmspec's own: 16-bit and float images are scaled to
    8 bits (PIL's RGB conversion would clip them to white).
    """
    if isinstance(source, Image.Image):
        return _rgb(source)
    if isinstance(source, (bytes, bytearray)):
        return _decode_image(BytesIO(source), "the image's bytes")
    if isinstance(source, torch.Tensor):
        source = _numpy(source)
        if source.ndim == 3 and source.shape[0] in (1, 3, 4) and source.shape[-1] not in (1, 3, 4):
            source = source.transpose(1, 2, 0)
    if isinstance(source, np.ndarray):
        return _image_from_array(source)
    if isinstance(source, (str, os.PathLike)):
        text = str(source)
        if text.startswith(("http://", "https://")):
            return _decode_image(BytesIO(_download(text)), text)
        if media_kind(_existing(text)) != "image":
            raise UnsupportedMediaError(f"{text}: a video was given where an image is expected")
        return _decode_image(text, text)
    raise NotAnImageError(
        f"cannot make an image from {shown_value(source)}: pass a path, an http(s) URL, a file's bytes, a PIL image, "
        f"an (H, W, C) array or a (C, H, W) tensor"
    )


def _download(url: str) -> bytes:
    """The bytes at `url`, fetched as `transformers` fetches image URLs."""
    import httpx

    try:
        response = httpx.get(url, timeout=10.0, follow_redirects=True)
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise NotAnImageError(f"{url}: could not download an image ({error})") from error
    return response.content


def _decode_image(file: str | BytesIO, name: str) -> Image.Image:
    """The image in `file` (a path or bytes), upright and in RGB; errors name it `name`."""
    try:
        with Image.open(file) as image:
            return _rgb(_upright(image, name))
    except Image.DecompressionBombError as error:
        raise NotAnImageError(f"{name}: too large to open safely ({error})") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise NotAnImageError(f"{name}: not a readable image ({error})") from error


def _upright(image: Image.Image, name: str) -> Image.Image:
    """The image turned by its EXIF orientation, as `transformers`' `load_image` turns it; as stored where the EXIF
    block is malformed (Pillow raises several kinds of error on those)."""
    try:
        return ImageOps.exif_transpose(image)
    except OSError:  # the pixels themselves cannot be read: not an EXIF problem
        raise
    except Exception as error:
        warnings.warn(f"{name}: malformed EXIF data ({error!r}); the image is used as stored", stacklevel=4)
        return image


def _rgb(image: Image.Image) -> Image.Image:
    """RGB as `transformers`' image processors convert (alpha onto white), 16-bit and float images first scaled."""
    if image.mode.startswith("I"):
        image = Image.fromarray((np.clip(np.asarray(image, dtype=np.int64), 0, 65535) >> 8).astype(np.uint8))
    elif image.mode == "F":
        values = np.asarray(image, dtype=np.float64)
        scale = 255.0 if values.size and values.min() >= 0 and values.max() <= 1 else 1.0
        image = Image.fromarray(np.clip(np.rint(values * scale), 0, 255).astype(np.uint8))
    try:
        return Image.fromarray(convert_to_rgb(image, return_numpy=True))
    except ValueError as error:
        raise NotAnImageError(f"cannot convert a PIL image of mode {image.mode} to RGB ({error})") from error


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as an array (bfloat16, which numpy lacks, as float32)."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()


def _image_from_array(array: np.ndarray) -> Image.Image:
    if array.ndim == 2:
        array = array[..., None].repeat(3, axis=-1)
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise NotAnImageError(f"an image array must be (H, W), (H, W, 3) or (H, W, 4); got shape {array.shape}")
    if array.size == 0:
        raise NotAnImageError(f"an image array with no pixels was given (shape {array.shape})")
    if np.issubdtype(array.dtype, np.integer) and array.dtype != np.uint8 and array.max() > 255:
        array = (np.clip(array, 0, 65535) >> 8).astype(np.uint8)  # 16-bit values keep their top 8 bits, as in files
    elif array.dtype != np.uint8:
        array = np.clip(array * (255.0 if array.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if array.shape[-1] == 1:
        array = array.repeat(3, axis=-1)
    return _rgb(Image.fromarray(array))


def frame_span(total: int, native_fps: float, start: float | None = None, end: float | None = None) -> range:
    """The indices of the frames between `start` and `end` seconds (the whole clip without them; an `end` past the
    clip's end means its end)."""
    if total <= 0:
        raise NoFramesError("the video has no frames")
    first = 0 if start is None else max(0, math.floor(start * native_fps))
    last = total - 1 if end is None else min(total - 1, math.ceil(end * native_fps) - 1)
    if first >= total:
        raise NoFramesError(
            f"start={start} s is past the end of the clip ({total / native_fps:.2f} s: {total} frames at "
            f"{native_fps:g} fps)"
        )
    if last < first:
        raise NoFramesError(f"no frame lies between start={start or 0} s and end={end} s ({native_fps:g} fps)")
    return range(first, last + 1)


def sample_indices(
    total: int,
    native_fps: float,
    num_frames: int | None = None,
    fps: float | None = None,
    max_frames: int | None = None,
    start: float | None = None,
    end: float | None = None,
    sampling: FrameSampling | None = None,
) -> np.ndarray:
    """Frame indices to decode from `total` frames at `native_fps`, by `sampling` (a family's rule; `EvenSampling`
    by default) from `num_frames`, or `fps` capped by `max_frames`, between `start` and `end` seconds.
    """
    check_frame_request(num_frames, fps, max_frames, start, end)
    span = frame_span(total, native_fps, start, end)
    rule = EvenSampling() if sampling is None else sampling
    return span.start + rule(len(span), native_fps, num_frames, fps, max_frames)


def load_video(
    source: Any,
    num_frames: int | None = None,
    fps: float | None = None,
    max_frames: int | None = None,
    start: float | None = None,
    end: float | None = None,
    source_fps: float = DEFAULT_FPS,
    sampling: FrameSampling | None = None,
) -> Video:
    """A sampled `Video` from a path (decord, frames chosen by `sampling`, see `sample_indices`), a `Video`, a
    `(T, H, W, 3)` array/tensor or a list of frames.

    Frames given directly are taken as they are, at `source_fps` frames per second.
    """
    if isinstance(source, Video):
        return source
    if isinstance(source, (str, os.PathLike)):
        check_frame_request(num_frames, fps, max_frames, start, end)
        request = dict(num_frames=num_frames, fps=fps, max_frames=max_frames, start=start, end=end)
        return _decode(str(source), request, sampling)
    if isinstance(source, torch.Tensor):
        source = _numpy(source)
    if isinstance(source, (list, tuple)):
        if not source:
            raise NoFramesError("an empty list of frames was given as a video")
        frames = [np.asarray(load_image(frame)) for frame in source]
        if len({frame.shape for frame in frames}) > 1:
            sizes = sorted({f"{frame.shape[1]}x{frame.shape[0]}" for frame in frames})
            raise UnreadableVideoError(f"the frames of a video must share one size; got {', '.join(sizes)}")
        source = np.stack(frames)
    if isinstance(source, np.ndarray):
        if source.ndim != 4 or source.shape[-1] != 3:
            raise UnreadableVideoError(f"a video array must have shape (T, H, W, 3); got {source.shape}")
        if source.shape[0] == 0:
            raise NoFramesError("a video array with no frames was given")
        return Video(source.astype(np.uint8, copy=False), np.arange(source.shape[0]), float(source_fps))
    raise UnreadableVideoError(
        f"cannot make a video from {type(source).__name__}: pass a path, a (T, H, W, 3) array or tensor, or a list "
        f"of frames"
    )


def _decode(path: str, request: dict[str, Any], sampling: FrameSampling | None) -> Video:
    if media_kind(_existing(path)) != "video":
        raise UnsupportedMediaError(f"{path}: an image was given where a video is expected")
    import decord

    try:
        reader = decord.VideoReader(path, ctx=decord.cpu(0))
    except Exception as error:
        if "cannot find video stream" in str(error):
            raise NoFramesError(f"{path}: no video stream with decodable frames") from error
        raise UnreadableVideoError(f"{path}: cannot open the video (corrupt, truncated or not a video)") from error
    total = len(reader)
    if total == 0:
        raise NoFramesError(f"{path}: the video has no frames")
    native_fps = float(reader.get_avg_fps())
    if not math.isfinite(native_fps) or native_fps < MIN_NATIVE_FPS:
        warnings.warn(
            f"{path}: the container states no usable frame rate ({native_fps:g} fps: a zero or broken time base); "
            f"assuming {DEFAULT_FPS:g} fps, so the times the model is told are guesses",
            stacklevel=3,
        )
        native_fps = DEFAULT_FPS
    try:
        indices = sample_indices(total, native_fps, **request, sampling=sampling)
    except NoFramesError as error:
        raise NoFramesError(f"{path}: {error}") from None
    try:
        frames = reader.get_batch(indices.tolist()).asnumpy()
    except Exception as error:
        raise UnreadableVideoError(f"{path}: decoding failed ({error})") from error
    if frames.shape[0] == 0:
        raise NoFramesError(f"{path}: no frames could be decoded")
    span = frame_span(total, native_fps, request["start"], request["end"])
    return Video(frames, indices, native_fps, path, total_frames=len(span))


def load_images(sources: Any) -> list[Image.Image]:
    """A list of RGB images from one source or a sequence of sources."""
    if sources is None:
        return []
    if isinstance(sources, (list, tuple)):
        return [load_image(s) for s in sources]
    return [load_image(sources)]


def load_videos(sources: Any, **sampling: Any) -> list[Video]:
    """A list of videos from one source or a sequence of sources (a list of arrays counts as several videos)."""
    if sources is None:
        return []
    if isinstance(sources, (list, tuple)) and sources and not _is_frame(sources[0]):
        return [load_video(s, **sampling) for s in sources]
    return [load_video(sources, **sampling)]


def _is_frame(item: Any) -> bool:
    """A single frame (PIL image or (H, W, 3) array), as opposed to a whole video."""
    return isinstance(item, Image.Image) or (isinstance(item, (np.ndarray, torch.Tensor)) and item.ndim == 3)


__all__: Sequence[str] = (
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "Video",
    "frame_span",
    "load_image",
    "load_images",
    "load_video",
    "load_videos",
    "media_kind",
    "sample_indices",
)
