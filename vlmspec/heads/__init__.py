"""Draft heads in the EAGLE-3 layout: one decoder layer over the target's own hidden states, drafting in place of a
whole VLM (`SpeculativeVLM(target, draft=head)`)."""

from .adapter import HeadAdapter
from .config import HEAD_ARCHITECTURE, HeadConfig, is_head_architecture
from .files import head_config_of, is_head, load_head, save_head
from .fit import check_head
from .module import Eagle3Head

__all__ = [
    "HEAD_ARCHITECTURE",
    "Eagle3Head",
    "HeadAdapter",
    "HeadConfig",
    "check_head",
    "head_config_of",
    "is_head",
    "is_head_architecture",
    "load_head",
    "save_head",
]
