"""The contract between the model-agnostic engine and one model family."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import DynamicCache, PreTrainedModel


@dataclass
class Prefill:
    """What a prefill leaves behind: logits of the last prompt token and the position of the next token."""

    last_logits: torch.Tensor
    length: int
    next_position: int


class ModelAdapter(ABC):
    """Family-specific knowledge: how to prefill a prompt and how to feed positioned, masked tokens."""

    #: Names of the model classes this adapter serves (matched against the model's class and its bases).
    model_classes: ClassVar[tuple[str, ...]] = ()
    #: The keyword inputs of the family's processor that go to the model (the rest are generation arguments).
    input_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    #: Modules that `"8bit"`/`"4bit"` presets leave unquantised (vision tower, projector, output head).
    quantization_skip_modules: ClassVar[tuple[str, ...]] = ("lm_head",)

    def __init__(self, model: PreTrainedModel):
        self.model = model

    @property
    def text_config(self) -> Any:
        return self.model.config.get_text_config()

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @abstractmethod
    def prefill(self, inputs: dict[str, Any], cache: DynamicCache) -> Prefill:
        """Run the prompt (text and visual inputs as the processor returned them) through the model into `cache`."""

    @abstractmethod
    def position_ids(self, positions: torch.Tensor) -> torch.Tensor:
        """The model's `position_ids` for text tokens at 1-D `positions` (q,)."""

    def decode(
        self, input_ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Logits `(q, V)` for `input_ids` (q,) at `positions`, attending through the additive mask `bias`."""
        out = self.model(
            input_ids=input_ids[None],
            position_ids=self.position_ids(positions),
            attention_mask=bias,
            past_key_values=cache,
            use_cache=True,
        )
        return out.logits[0]
