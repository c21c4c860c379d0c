"""Generation arguments resolved the way `transformers`' `generate` resolves them.

Greedy decoding, and sampling whose warped distribution keeps one token (a top-k of 1, as Qwen2.5-VL-Instruct's
released config has), pick one token deterministically: both run here. Wider sampling raises
`SamplingConfigError` naming the settings and the override.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..engine.choice import NodeProcessing, TargetChoice
from ..engine.loop import DecodeSettings
from ..errors import SamplingConfigError


def resolve_generation(
    target: PreTrainedModel,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    input_ids: torch.Tensor,
    model_kwargs: dict[str, Any],
) -> DecodeSettings:
    """Merge `generation_config`, the target's own config and `kwargs`; refuse what vlmspec cannot honour exactly."""
    has_default_max_length = (
        kwargs.get("max_length") is None
        and (generation_config is None or generation_config.max_length is None)
        and target.generation_config.max_length is None
    )
    config, unused = target._prepare_generation_config(generation_config, **kwargs)
    if unused:
        raise TypeError(f"generate() got arguments it does not use: {', '.join(sorted(unused))}")
    if config.do_sample and config.top_k != 1:
        raise SamplingConfigError(
            f"the generation config samples ({_sampling_settings(config)}) and vlmspec cannot sample exactly yet: "
            "pass do_sample=False (greedy; --greedy on the command line), or top_k=1"
        )
    if (config.num_beams or 1) > 1:
        raise NotImplementedError("beam search is not supported by speculative decoding; pass num_beams=1")
    prompt_length = input_ids.shape[1]
    if config.max_new_tokens is not None:
        max_new_tokens = config.max_new_tokens
    elif has_default_max_length:
        limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
        max_new_tokens = config.max_length if limit is None else min(config.max_length, limit - prompt_length)
    else:
        max_new_tokens = config.max_length - prompt_length
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length
    target._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=input_ids.device, batch_size=1)

    def processors(for_config: GenerationConfig) -> LogitsProcessorList:
        return target._get_logits_processor(
            generation_config=for_config,
            input_ids_seq_length=prompt_length,
            encoder_input_ids=input_ids,
            logits_processor=LogitsProcessorList(),
            device=input_ids.device,
            model_kwargs=model_kwargs,
        )

    # The draft ranks its proposals by the processed logits without warpers: the same order, no truncation.
    draft_config = copy.copy(config)
    draft_config.do_sample = False
    draft_processors = processors(draft_config)
    eos = config._eos_token_tensor
    return DecodeSettings(
        max_new_tokens=max(0, max_new_tokens),
        eos_token_ids=torch.empty(0, dtype=torch.long) if eos is None else eos.flatten(),
        choice=TargetChoice(NodeProcessing(processors(config))),
        draft_processing=NodeProcessing(draft_processors) if draft_processors else None,
    )


def _sampling_settings(config: GenerationConfig) -> str:
    """The sampling settings of `config` that are set, as `name=value` pairs."""
    names = ("temperature", "top_k", "top_p", "min_p", "typical_p")
    defaults = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "typical_p": 1.0}
    shown = [f"{n}={getattr(config, n)}" for n in names if getattr(config, n, None) not in (None, defaults.get(n))]
    return ", ".join(["do_sample=True", *shown])
