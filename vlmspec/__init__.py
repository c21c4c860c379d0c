"""vlmspec: lossless speculative decoding for vision-language models, with entropy-adaptive draft trees (SAGE)."""

from .api import generate, load_pair
from .engine.stats import SpecStats, StepRecord
from .errors import (
    ContextTooLongError,
    EmptyPromptError,
    InvalidArgumentError,
    MediaNotFoundError,
    MediaRejectedError,
    MemoryBudgetError,
    NoFramesError,
    NoInputsError,
    NotAnImageError,
    OutputInUseError,
    PlaceholderMismatchError,
    PromptTypeError,
    UnreadableVideoError,
    UnsupportedAttentionError,
    UnsupportedGenerationError,
    UnsupportedMediaError,
    UnsupportedModelError,
    VLMSpecError,
    VocabularyMismatchError,
)
from .hf.cache import SpeculativeCache
from .hf.pipeline import pipeline
from .policies import (
    AutoPolicy,
    ChainLengthConfig,
    ChainPolicy,
    DraftGateConfig,
    SageConfig,
    SageGtConfig,
    SageGtPolicy,
    SagePolicy,
    StaticTreePolicy,
    StepLesson,
    StepOutcome,
    TreePlan,
    TreePolicy,
)
from .pruning import PruningConfig
from .speculative import SpeculativeVLM

__version__ = "0.1.0"

__all__ = [
    "AutoPolicy",
    "ChainLengthConfig",
    "ChainPolicy",
    "ContextTooLongError",
    "DraftGateConfig",
    "EmptyPromptError",
    "InvalidArgumentError",
    "MediaNotFoundError",
    "MediaRejectedError",
    "MemoryBudgetError",
    "NoFramesError",
    "NoInputsError",
    "NotAnImageError",
    "OutputInUseError",
    "PlaceholderMismatchError",
    "PromptTypeError",
    "UnreadableVideoError",
    "UnsupportedAttentionError",
    "UnsupportedGenerationError",
    "UnsupportedMediaError",
    "PruningConfig",
    "SageConfig",
    "SageGtConfig",
    "SageGtPolicy",
    "SagePolicy",
    "SpecStats",
    "SpeculativeCache",
    "SpeculativeVLM",
    "StaticTreePolicy",
    "StepLesson",
    "StepOutcome",
    "StepRecord",
    "TreePlan",
    "TreePolicy",
    "UnsupportedModelError",
    "VLMSpecError",
    "VocabularyMismatchError",
    "generate",
    "load_pair",
    "pipeline",
]
