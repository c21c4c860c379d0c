"""Generation arguments resolved the way `transformers`' `generate` resolves them.

The target's processors and warpers decide each token, greedy or sampled. The draft proposes under the same
processing; a top-k of 1 (Qwen2.5-VL-Instruct's released config) leaves the target one token, so the draft then
ranks by its processed logits without the warpers, which would leave it a single candidate too.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel

from ..engine.choice import NodeProcessing, TargetSampler
from ..engine.sequence import DecodeSettings


def resolve_generation(
    target: PreTrainedModel,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    input_ids: torch.Tensor,
    model_kwargs: dict[str, Any],
    generator: torch.Generator | None = None,
) -> DecodeSettings:
    """Merge `generation_config`, the target's own config and `kwargs`; refuse what vlmspec cannot honour exactly.

    Sampling draws from `generator`, or from the global RNG as `generate` does. `input_ids` and `model_kwargs`
    must sit on the target's device: the processors keep tensors (EOS ids, banned ids) on the device they are built on.
    """
    has_default_max_length = (
        kwargs.get("max_length") is None
        and (generation_config is None or generation_config.max_length is None)
        and target.generation_config.max_length is None
    )
    config, unused = target._prepare_generation_config(generation_config, **kwargs)
    if unused:
        raise TypeError(f"generate() got arguments it does not use: {', '.join(sorted(unused))}")
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

    target_processors = draft_processors = processors(config)
    if config.do_sample and config.top_k == 1:
        draft_config = copy.copy(config)
        draft_config.do_sample = False
        draft_processors = processors(draft_config)
    eos, pad = config._eos_token_tensor, config._pad_token_tensor
    return DecodeSettings(
        max_new_tokens=max(0, max_new_tokens),
        eos_token_ids=torch.empty(0, dtype=torch.long, device=input_ids.device) if eos is None else eos.flatten(),
        sampler=TargetSampler(NodeProcessing(target_processors), bool(config.do_sample), generator),
        draft_processing=NodeProcessing(draft_processors) if draft_processors else None,
        num_sequences=config.num_return_sequences or 1,
        pad_token_id=None if pad is None else int(pad.reshape(-1)[0]),
    )
