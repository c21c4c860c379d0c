"""A `/v1/chat/completions` body read as OpenAI and vLLM define it for VLMs: its messages made into the target's chat
template with the media in place, and its sampling fields made into `generate`'s arguments. Every field is checked and
a bad one refused with an `APIError` naming it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import torch
from PIL import Image

from ..engine.relaxed import RelaxedVerification
from ..processors import Video
from ..processors.inputs import VisualInputs
from .errors import APIError
from .media import MediaFetcher

#: Fields vlmspec cannot honour, refused when given a value that asks for them (None and the neutral values pass).
_REFUSED = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "logit_bias": (None, {}),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "response_format": (None, {"type": "text"}),
}
_ROLES = ("system", "user", "assistant", "developer")


@dataclass
class ServeLimits:
    """What one request may ask for: images (video frames sent as images count too), videos, frames of each video,
    choices (`n`), new tokens when it names none, and whether it may ask for relaxed (lossy) verification."""

    max_images: int = 32
    max_videos: int = 4
    max_frames: int = 64
    max_n: int = 8
    default_max_tokens: int = 256
    allow_lossy: bool = False


@dataclass
class ChatRequest:
    """A checked chat request: the template's messages (media as `{"type": "image"|"video"}` parts) with the media
    URLs in order, and how to decode it."""

    model: str
    messages: list[dict[str, Any]]
    media: list[tuple[str, str, str]]
    options: dict[str, Any]
    seed: int | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    num_frames: int | None = None
    fps: float | None = None

    @property
    def max_new_tokens(self) -> int:
        return self.options["max_new_tokens"]


def parse_chat(body: Any, limits: ServeLimits, config_max_new_tokens: int | None) -> ChatRequest:
    """The request in `body` (parsed JSON), checked. `config_max_new_tokens` is the target's generation config's own
    `max_new_tokens` (used when the request gives none, else `limits.default_max_tokens`)."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, neutral in _REFUSED.items():
        if body.get(name, None) not in neutral:
            raise APIError(400, f"{name}={body[name]!r} is not supported by this server", name, "unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "`model` is required: the name GET /v1/models lists", "model")
    messages, media = _messages(body.get("messages"), limits)
    options, stop = _generation_options(body, limits, config_max_new_tokens)
    n = _integer(body, "n", 1)
    n = 1 if n is None else n
    if n > limits.max_n:
        raise APIError(400, f"n={n} is more than this server gives per request ({limits.max_n})", "n")
    stream, include_usage = _streaming(body)
    num_frames, fps = _frame_request(body)
    return ChatRequest(
        model=model,
        messages=messages,
        media=media,
        options=options,
        seed=_integer(body, "seed", None),
        n=n,
        stream=stream,
        include_usage=include_usage,
        stop=stop,
        num_frames=num_frames,
        fps=fps,
    )


def _generation_options(
    body: dict[str, Any], limits: ServeLimits, config_max_new_tokens: int | None
) -> tuple[dict[str, Any], list[str]]:
    """`generate`'s arguments for the request's token limit and sampling fields (a field not given stays the
    target's generation config's), and its stop strings."""
    options: dict[str, Any] = {"max_new_tokens": _max_tokens(body, limits, config_max_new_tokens)}
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None:
        options.update({"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature})
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p is not None:
        if top_p == 0:
            raise APIError(400, "top_p must be above 0", "top_p")
        options["top_p"] = top_p
    top_k = _integer(body, "top_k", -1)
    if top_k is not None and top_k > 0:
        options["top_k"] = top_k
    elif top_k is not None:
        options["top_k"] = None
    repetition_penalty = _number(body, "repetition_penalty", 0.0, math.inf)
    if repetition_penalty is not None:
        if repetition_penalty == 0:
            raise APIError(400, "repetition_penalty must be above 0", "repetition_penalty")
        options["repetition_penalty"] = repetition_penalty
    stop = _stop(body.get("stop"))
    if stop:
        options["stop_strings"] = stop
    if body.get("verification") is not None:
        options["verification"] = _verification(body["verification"], limits.allow_lossy)
    return options, stop


def _verification(value: Any, allow_lossy: bool) -> str | RelaxedVerification:
    """The request's `verification`: "exact", or "relaxed" / an object of `RelaxedVerification`'s fields (`tau_base`,
    `gamma`, `top_beta`, `direction`), refused unless the server allows lossy output."""
    if value == "exact":
        return "exact"
    if value != "relaxed" and not isinstance(value, dict):
        raise APIError(400, "verification must be 'exact', 'relaxed' or an object of relaxed settings", "verification")
    if not allow_lossy:
        raise APIError(
            400,
            "verification='relaxed' makes the output differ from the target's own, and this server was not started "
            "with --allow-lossy",
            "verification",
            "lossy_not_allowed",
        )
    if value == "relaxed":
        return RelaxedVerification()
    unknown = sorted(set(value) - {"tau_base", "gamma", "top_beta", "direction"})
    if unknown:
        raise APIError(400, f"verification: unknown settings {', '.join(unknown)}", "verification")
    try:
        return RelaxedVerification(**value)
    except (TypeError, ValueError) as error:
        raise APIError(400, f"verification: {error}", "verification") from None


def _streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the answer is streamed, and whether a stream ends with a usage chunk (`stream_options`)."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise APIError(400, "stream must be true or false", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or not isinstance(stream_options.get("include_usage", False), bool):
        raise APIError(400, "stream_options must be an object whose include_usage is true or false", "stream_options")
    return bool(stream), bool(stream_options.get("include_usage", False))


def _frame_request(body: dict[str, Any]) -> tuple[int | None, float | None]:
    """The request's own video sampling: vLLM's `num_frames` or `fps` (not both), each None when not given."""
    num_frames = _integer(body, "num_frames", 1)
    fps = _number(body, "fps", 0.0, math.inf)
    if fps == 0:
        raise APIError(400, "fps must be above 0", "fps")
    if num_frames is not None and fps is not None:
        raise APIError(400, "give num_frames or fps, not both", "num_frames")
    return num_frames, fps


def _messages(messages: Any, limits: ServeLimits) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """The template's messages, and each medium as `(kind, url, param)` in the order the template places them."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "`messages` must be a non-empty list of chat messages", "messages")
    out, media = [], []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"{where} must be an object with a role and content", where)
        role = message.get("role")
        if role not in _ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(_ROLES)}; got {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": "system" if role == "developer" else role, "content": content})
            continue
        if not isinstance(content, list) or not content:
            raise APIError(400, f"{where}.content must be a string or a non-empty list of parts", f"{where}.content")
        parts = []
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise APIError(400, f"{at}.text must be a string", f"{at}.text")
                parts.append({"type": "text", "text": part["text"]})
            elif kind in ("image_url", "video_url"):
                if role != "user":
                    raise APIError(400, f"{at}: only user messages may carry images or videos", at)
                url = part.get(kind)
                url = url.get("url") if isinstance(url, dict) else url
                media.append((kind.removesuffix("_url"), url, f"{at}.{kind}.url"))
                parts.append({"type": kind.removesuffix("_url")})
            else:
                raise APIError(400, f"{at}.type must be text, image_url or video_url; got {kind!r}", f"{at}.type")
        out.append({"role": "system" if role == "developer" else role, "content": parts})
    if out[-1]["role"] == "assistant":
        raise APIError(400, "the last message must not be the assistant's: there is nothing to answer", "messages")
    if not any(m["role"] == "user" for m in out):
        raise APIError(400, "`messages` has no user message", "messages")
    videos = sum(kind == "video" for kind, _, _ in media)
    if videos > limits.max_videos:
        raise APIError(
            400, f"{videos} videos in one request; this server takes {limits.max_videos} at most", "messages"
        )
    images = len(media) - videos
    if images > limits.max_images:
        raise APIError(
            400, f"{images} images in one request; this server takes at most {limits.max_images}", "messages"
        )
    return out, media


def _max_tokens(body: dict[str, Any], limits: ServeLimits, config_max_new_tokens: int | None) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = _integer(body, name, None)
        if value is not None:
            if value < 1:
                raise APIError(400, f"{name} must be at least 1; got {value}", name)
            return value
    return config_max_new_tokens or limits.default_max_tokens


def _integer(body: dict[str, Any], name: str, minimum: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"{name} must be an integer; got {value!r}", name)
    if minimum is not None and value < minimum:
        raise APIError(400, f"{name} must be at least {minimum}; got {value}", name)
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not low <= value <= high:
        raise APIError(400, f"{name} must be a number from {low:g} to {high:g}; got {value!r}", name)
    return float(value)


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise APIError(400, "stop must be a non-empty string or a list of up to 4 of them", "stop")
    return stops


def model_inputs(
    request: ChatRequest, processor: VisualInputs, fetcher: MediaFetcher, limits: ServeLimits
) -> dict[str, torch.Tensor]:
    """The target processor's inputs for the request: its media fetched and decoded, its chat through the template.
    Slow (downloads, video decoding): run it off the event loop."""
    images: list[Image.Image] = []
    videos: list[Video] = []
    for kind, url, param in request.media:
        if kind == "image":
            images.append(fetcher.image(url, param))
        else:
            video = fetcher.video(
                url, param, processor.frame_sampling, request.num_frames, request.fps, limits.max_frames
            )
            videos.append(video.padded(processor.min_video_frames))
    try:
        text = processor.apply_chat_template(request.messages)
    except Exception as error:  # noqa: BLE001 - a template that refuses the chat (e.g. role order) is bad input
        raise APIError(400, f"the model's chat template refuses these messages ({error})", "messages") from error
    try:
        return dict(processor(text, images=images, videos=videos))
    except Exception as error:  # noqa: BLE001 - what the processor cannot take is the request's problem
        raise APIError(400, f"the model's processor refuses the media ({error})", "messages") from error
