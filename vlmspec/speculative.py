"""`SpeculativeVLM`: a target and a draft that together `generate` exactly what the target alone would, faster."""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .adapters import adapter_for
from .engine.loop import SpeculativeDecoder
from .engine.runner import ModelRunner
from .engine.stats import SpecStats
from .errors import BatchSizeError, VocabularyMismatchError
from .hf.generation import resolve_generation
from .policies import SageConfig, TreePolicy, resolve_policy

_SPECIAL_TOKEN_ATTRIBUTES = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def check_vocabularies(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    """Refuse a pair whose output vocabularies or multimodal special tokens differ (their ids would mean other tokens)."""
    target_vocab = target.get_output_embeddings().weight.shape[0]
    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    if target_vocab != draft_vocab:
        raise VocabularyMismatchError(
            f"the draft's vocabulary has {draft_vocab} tokens but the target's has {target_vocab}; "
            "a draft must share the target's tokenizer"
        )
    for name in _SPECIAL_TOKEN_ATTRIBUTES:
        t, d = getattr(target.config, name, None), getattr(draft.config, name, None)
        if t is not None and d is not None and t != d:
            raise VocabularyMismatchError(f"{name} is {d} in the draft but {t} in the target")


class SpeculativeVLM:
    """Drop-in for `target.generate` with greedy decoding: same token ids, fewer target forwards.

    `policy` is `"sage"` (default), `"chain"`, `"static-tree"`, a `SageConfig` or a `TreePolicy`. One sequence
    per call: inputs with batch size > 1 raise `BatchSizeError`.
    """

    def __init__(
        self, target: PreTrainedModel, draft: PreTrainedModel, policy: str | SageConfig | TreePolicy = "sage"
    ):
        self.target = target
        self.draft = draft
        self._target_runner = ModelRunner(adapter_for(target))
        self._draft_runner = ModelRunner(adapter_for(draft))
        check_vocabularies(target, draft)
        self.policy = resolve_policy(policy)
        self._decoder = SpeculativeDecoder(
            self._target_runner, self._draft_runner, self.policy, self._target_runner.adapter.vocab_size
        )
        self.last_stats: SpecStats | None = None

    @torch.inference_mode()
    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        streamer: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor | GenerateDecoderOnlyOutput:
        """Greedy generation equal, token for token, to `target.generate(**inputs, do_sample=False)`."""
        if input_ids is None:
            raise ValueError("generate() needs input_ids (what the target's processor returned)")
        if input_ids.ndim != 2 or input_ids.shape[0] != 1:
            raise BatchSizeError(
                f"input_ids has shape {tuple(input_ids.shape)}: vlmspec decodes one sequence per call; "
                "loop over the batch or use the batch captioning tools"
            )
        input_keys = self._target_runner.adapter.input_keys
        model_inputs = {k: kwargs.pop(k) for k in input_keys if k != "input_ids" and kwargs.get(k) is not None}
        mask = model_inputs.get("attention_mask")
        if mask is not None and not bool(mask.all()):
            raise BatchSizeError("attention_mask has padding; pass a single unpadded sequence")
        return_dict = kwargs.pop("return_dict_in_generate", None)
        settings = resolve_generation(self.target, generation_config, kwargs, input_ids, dict(model_inputs))
        model_inputs["input_ids"] = input_ids
        target_inputs = _to_device(model_inputs, self._target_runner.device)
        draft_inputs = _to_device(model_inputs, self._draft_runner.device)
        settings.eos_token_ids = settings.eos_token_ids.to(self._target_runner.device)
        sequences, self.last_stats = self._decoder.run(target_inputs, draft_inputs, settings, streamer)
        if return_dict or (return_dict is None and self.target.generation_config.return_dict_in_generate):
            return GenerateDecoderOnlyOutput(sequences=sequences)
        return sequences

    def __repr__(self) -> str:
        return (
            f"SpeculativeVLM(target={type(self.target).__name__}, draft={type(self.draft).__name__}, "
            f"policy={self.policy.name})"
        )


def _to_device(inputs: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
