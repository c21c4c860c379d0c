"""Checks of a request's arguments before any model runs, each failure naming the argument and its value."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from ..errors import ContextTooLongError, EmptyPromptError, InvalidArgumentError, PromptTypeError


def check_prompts(prompt: Any) -> list[str]:
    """The prompts of a call: one string, or a non-empty list of strings, none of them empty."""
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise PromptTypeError(f"prompt must be a string or a non-empty list of strings, got {shown_value(prompt)}")
    for i, text in enumerate(prompts):
        name = "prompt" if isinstance(prompt, str) else f"prompt[{i}]"
        if not isinstance(text, str):
            raise PromptTypeError(f"{name} must be a string, got {shown_value(text)}")
        if not text.strip():
            raise EmptyPromptError(f"{name} is empty: {text!r}")
    return list(prompts)


def check_count(name: str, value: Any, *, optional: bool = True) -> None:
    """`value` is a whole number of at least 1 (or None where `optional`)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise InvalidArgumentError(f"{name} must be a whole number of at least 1, got {shown_value(value)}")


def check_rate(name: str, value: Any) -> None:
    """`value` is None or a finite number above 0."""
    if value is None:
        return
    if not _finite(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a number above 0, got {shown_value(value)}")


def check_frame_request(
    num_frames: Any = None, fps: Any = None, max_frames: Any = None, start: Any = None, end: Any = None
) -> None:
    """Frame sampling arguments: counts of at least 1, a rate above 0, one of `num_frames` and `fps`, and `start`
    before `end`, both at or after 0 seconds."""
    check_count("num_frames", num_frames)
    check_rate("fps", fps)
    check_count("max_frames", max_frames)
    if num_frames is not None and fps is not None:
        raise InvalidArgumentError(f"num_frames ({num_frames}) and fps ({fps}) are exclusive: pass one of them")
    for name, value in (("start", start), ("end", end)):
        if value is not None and (not _finite(value) or value < 0):
            raise InvalidArgumentError(f"{name} must be a number of seconds at or after 0, got {shown_value(value)}")
    if start is not None and end is not None and end <= start:
        raise InvalidArgumentError(f"end ({end} s) must come after start ({start} s)")


def check_context(
    limit: int | None,
    length: int,
    max_new_tokens: int,
    what: str = "the prompt",
    remedy: str = "fewer frames, smaller images, a shorter prompt or fewer new tokens fit",
) -> None:
    """`length` prompt tokens and `max_new_tokens` fit in the model's context of `limit` tokens."""
    if limit is not None and length + max_new_tokens > limit:
        raise ContextTooLongError(
            f"{what} takes {length} tokens and max_new_tokens is {max_new_tokens}: {length + max_new_tokens} exceeds "
            f"the model's context of {limit} tokens ({remedy})"
        )


def _finite(value: Any) -> bool:
    """A finite real number (numpy's included), not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def shown_value(value: Any) -> str:
    """A value as error messages show it: its type and its repr, cut at 60 characters."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
