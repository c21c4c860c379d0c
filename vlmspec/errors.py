"""vlmspec's exceptions: one class per kind of problem, each message naming what is wrong."""

from __future__ import annotations


class VLMSpecError(Exception):
    """Base class of every error vlmspec raises on purpose."""


class UnsupportedModelError(VLMSpecError, TypeError):
    """The model class has no adapter (vlmspec does not know how to prefill or position its tokens)."""


class UnsupportedAttentionError(VLMSpecError, ValueError):
    """A model loaded with an attention implementation that cannot apply a tree mask (`flash_attention_2`)."""


class VocabularyMismatchError(VLMSpecError, ValueError):
    """The draft and target do not map the same token ids to the same tokens."""


class MemoryBudgetError(VLMSpecError, MemoryError):
    """A sequence whose KV cache alone exceeds the memory budget given for the rows decoded together."""


class NoInputsError(VLMSpecError, ValueError):
    """A batch job whose sources name no image or video (empty folders, an empty list file)."""


class OutputInUseError(VLMSpecError, FileExistsError):
    """Another run is writing the same output file (it holds the lock beside it)."""


class MediaNotFoundError(VLMSpecError, FileNotFoundError):
    """An image or video path does not exist."""


class UnsupportedMediaError(VLMSpecError, ValueError):
    """A file whose extension is neither a supported image nor a supported video format."""


class NotAnImageError(VLMSpecError, ValueError):
    """A file or object that cannot be decoded as an image."""


class UnreadableVideoError(VLMSpecError, ValueError):
    """A video file that cannot be opened or decoded (corrupt, truncated, not a video)."""


class NoFramesError(VLMSpecError, ValueError):
    """A video with no decodable frames, or a frame range that selects none."""


class EmptyPromptError(VLMSpecError, ValueError):
    """A prompt that is empty or only whitespace."""


class PlaceholderMismatchError(VLMSpecError, ValueError):
    """A prompt whose `<image>`/`<video>` placeholders do not match the media given."""


class ContextTooLongError(VLMSpecError, ValueError):
    """The prompt plus the requested new tokens exceed the model's context length."""


class MediaRejectedError(VLMSpecError, ValueError):
    """An image or video the model's processor refuses (Qwen's take aspect ratios up to 200:1), named with why."""


class InvalidArgumentError(VLMSpecError, ValueError):
    """An argument of the wrong kind or outside its range (`max_new_tokens`, `num_frames`, `max_frames` not a whole
    number of at least 1, `fps` not above 0, both `num_frames` and `fps`, a negative or reversed `start`/`end`),
    named with its value."""


class PromptTypeError(VLMSpecError, TypeError):
    """A prompt that is neither a string nor a list of strings."""


class CalibrationError(VLMSpecError, ValueError):
    """A policy's offline calibration (HeteroSpec's path-entropy bins) missing for a pair, unreadable, or fitted to
    another pair."""


class UnsupportedGenerationError(VLMSpecError, NotImplementedError):
    """A `generate` argument or generation-config field vlmspec cannot honour exactly (beam search, hidden states,
    classifier-free guidance, ...), named with why."""


class RequestCancelled(VLMSpecError):
    """A sequence its caller gave up on (a server's client that disconnected): its row was freed at the next step."""


class HeadLayoutError(VLMSpecError, ValueError):
    """A draft head whose files do not follow the EAGLE-3 layout (config fields, weight names or shapes), or that does
    not fit its target (hidden size, vocabulary, family, feature layers), named with the field."""
