"""vlmspec's exceptions: one class per kind of problem, each message naming what is wrong."""

from __future__ import annotations


class VLMSpecError(Exception):
    """Base class of every error vlmspec raises on purpose."""


class UnsupportedModelError(VLMSpecError, TypeError):
    """The model class has no adapter (vlmspec does not know how to prefill or position its tokens)."""


class VocabularyMismatchError(VLMSpecError, ValueError):
    """The draft and target do not map the same token ids to the same tokens."""


class BatchSizeError(VLMSpecError, ValueError):
    """The inputs hold more than one sequence; speculative decoding here runs one sequence at a time."""
