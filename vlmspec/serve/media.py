"""Media named by a chat request's URLs: `data:` base64, http(s) fetched under a timeout and a size limit, and
`file://` only inside the folder the server was told to allow (its real path: `..` and symlinks cannot leave it)."""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from PIL import Image

from ..processors import Video, load_image, load_video
from ..processors.frame_sampling import FrameSampling
from .errors import APIError


@dataclass
class MediaLimits:
    """Where media may come from and how much of it: `allowed_local` is the folder `file://` URLs may name (None:
    none), `max_bytes` caps one fetched or inlined medium, `timeout` one whole download in seconds, and
    `allowed_domains` the hosts http(s) URLs may name (None: any; redirects are then not followed)."""

    allowed_local: Path | None = None
    max_bytes: int = 50_000_000
    timeout: float = 10.0
    allowed_domains: frozenset[str] | None = None


class MediaFetcher:
    """Turns `image_url`/`video_url` URLs into images and sampled videos; every failure is an `APIError` naming the
    request field (`param`) and the problem."""

    def __init__(self, limits: MediaLimits):
        self.limits = limits
        self._root = None if limits.allowed_local is None else Path(os.path.realpath(limits.allowed_local))

    def image(self, url: str, param: str) -> Image.Image:
        source = self._source(url, param)
        try:
            return load_image(source)
        except Exception as error:  # noqa: BLE001 - every undecodable medium is the caller's bad input
            raise APIError(400, f"{param}: not a readable image ({_reason(error)})", param=param) from error

    def video(
        self,
        url: str,
        param: str,
        sampling: FrameSampling,
        num_frames: int | None,
        fps: float | None,
        max_frames: int,
    ) -> Video:
        """The video at `url`, sampled by the family's rule (`num_frames`, or `fps` capped by `max_frames`)."""
        source = self._source(url, param)
        if num_frames is not None and num_frames > max_frames:
            raise APIError(
                400, f"num_frames={num_frames} is more than this server takes per video ({max_frames})", "num_frames"
            )
        try:
            if isinstance(source, Path):
                return load_video(source, num_frames, fps, max_frames, sampling=sampling)
            with tempfile.NamedTemporaryFile(suffix=".mp4") as file:
                file.write(source)
                file.flush()
                video = load_video(file.name, num_frames, fps, max_frames, sampling=sampling)
                video.source = "<video_url>"
                return video
        except APIError:
            raise
        except Exception as error:  # noqa: BLE001 - every undecodable medium is the caller's bad input
            raise APIError(400, f"{param}: not a readable video ({_reason(error)})", param=param) from error

    def _source(self, url: str, param: str) -> bytes | Path:
        """The medium's bytes (inlined or downloaded) or its allowed local path."""
        if not isinstance(url, str) or not url:
            raise APIError(400, f"{param} must be a non-empty URL string", param=param)
        try:
            scheme = urlparse(url).scheme.lower()
        except ValueError as error:
            raise APIError(400, f"{param}: not a URL ({error})", param=param) from error
        if scheme == "data":
            return self._inline(url, param)
        if scheme in ("http", "https"):
            return self._download(url, param)
        if scheme == "file":
            return self._local(url, param)
        raise APIError(
            400, f"{param}: unsupported URL scheme {scheme or '(none)'!r}; use data:, http(s): or file:", param=param
        )

    def _inline(self, url: str, param: str) -> bytes:
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise APIError(400, f"{param}: a data URL must be data:<type>;base64,<payload>", param=param)
        if len(payload) * 3 // 4 > self.limits.max_bytes:
            raise APIError(413, f"{param}: the inlined medium exceeds {self.limits.max_bytes} bytes", param=param)
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as error:
            raise APIError(400, f"{param}: the data URL's payload is not valid base64", param=param) from error

    def _download(self, url: str, param: str) -> bytes:
        import httpx

        limit, allowed = self.limits.max_bytes, self.limits.allowed_domains
        if allowed is not None and (urlparse(url).hostname or "").lower() not in allowed:
            raise APIError(403, f"{param}: {urlparse(url).hostname} is not an allowed media domain", param=param)
        deadline = time.monotonic() + self.limits.timeout
        try:
            with httpx.stream("GET", url, timeout=self.limits.timeout, follow_redirects=allowed is None) as response:
                response.raise_for_status()
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise APIError(400, f"{param}: {url} is larger than {limit} bytes", param=param)
                    if time.monotonic() > deadline:
                        raise APIError(400, f"{param}: {url} took longer than {self.limits.timeout:g} s", param=param)
                return bytes(body)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as error:
            raise APIError(400, f"{param}: could not fetch {url} ({_reason(error)})", param=param) from error

    def _local(self, url: str, param: str) -> Path:
        if self._root is None:
            raise APIError(
                400,
                f"{param}: file:// URLs are refused (start the server with --allowed-local-media-path FOLDER)",
                param=param,
            )
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise APIError(400, f"{param}: a file:// URL must name a local path", param=param)
        try:
            path = Path(os.path.realpath(unquote(parsed.path)))
        except ValueError as error:
            raise APIError(400, f"{param}: not a usable path ({error})", param=param) from error
        if not path.is_relative_to(self._root):
            raise APIError(403, f"{param}: {unquote(parsed.path)} is outside the allowed media folder", param=param)
        if not path.is_file():
            raise APIError(400, f"{param}: {unquote(parsed.path)} is not a file", param=param)
        if path.stat().st_size > self.limits.max_bytes:
            raise APIError(400, f"{param}: the file is larger than {self.limits.max_bytes} bytes", param=param)
        return path


def _reason(error: Exception) -> str:
    """An error's message, without a temporary file's name."""
    text = str(error) or type(error).__name__
    return text.replace(tempfile.gettempdir(), "<tmp>")
