"""Generation arguments resolved the way `transformers`' `generate` resolves them.

The target's processors and warpers (the config's, then the caller's `logits_processor` and
`prefix_allowed_tokens_fn`, merged as `generate` merges them) decide each token, greedy or sampled. The draft
proposes under the same processing; a top-k of 1 (Qwen2.5-VL-Instruct's released config) leaves the target one
token, so the draft then ranks by its processed logits without the warpers, which would leave it a single candidate
too. Stopping criteria are merged as `generate` merges them and sorted by how the engine checks them
(`engine.stopping`).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.logits_process import LogitsProcessor
from transformers.generation.stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxTimeCriteria,
    StopStringCriteria,
)

from ..engine.processing import NodeProcessing, TargetSampler
from ..engine.sequence import DecodeSettings
from ..engine.stopping import Stopping
from ..errors import UnsupportedGenerationError
from .contract import REFUSED_ARGUMENTS, check_arguments, check_config, check_fields

#: `generate`'s own arguments that are not generation-config fields or model inputs (`trust_remote_code` only
#: serves `custom_generate`, which is refused when given).
_DECODING_ARGUMENTS = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "tokenizer",
    "synced_gpus",
    "trust_remote_code",
)


def refuse_early(generation_config: GenerationConfig | None, kwargs: dict[str, Any]) -> None:
    """Refuse what a call sets that vlmspec refuses (arguments and config fields, by name) before any check of its
    inputs, which would otherwise hide the refusal behind another error."""
    check_arguments(
        {name for name in REFUSED_ARGUMENTS if kwargs.get(name) is not None}, synced_gpus=kwargs.get("synced_gpus")
    )
    check_fields({**vars(generation_config or GenerationConfig()), **kwargs})


def resolve_generation(
    target: PreTrainedModel,
    generation_config: GenerationConfig | None,
    kwargs: dict[str, Any],
    input_ids: torch.Tensor,
    model_kwargs: dict[str, Any],
    generator: torch.Generator | None = None,
) -> DecodeSettings:
    """Merge `generation_config`, the target's own config and `kwargs` (config fields and `generate`'s own arguments:
    `logits_processor`, `stopping_criteria`, `prefix_allowed_tokens_fn`, `tokenizer`); refuse what vlmspec cannot
    honour exactly, naming it.

    Sampling draws from `generator`, or from the global RNG as `generate` does. `input_ids` and `model_kwargs`
    must sit on the target's device: the processors keep tensors (EOS ids, banned ids) on the device they are built on.
    """
    kwargs = dict(kwargs)
    own = {name: kwargs.pop(name, None) for name in _DECODING_ARGUMENTS}
    refused = {name: kwargs.pop(name) for name in REFUSED_ARGUMENTS if name in kwargs}
    check_arguments({name for name, value in refused.items() if value is not None}, synced_gpus=own["synced_gpus"])
    config = _merged_config(target, generation_config, kwargs, input_ids)
    prompt_length = input_ids.shape[1]
    custom = LogitsProcessorList(own["logits_processor"] or [])
    target_processors, draft_processors, draft_sampling = _logits_processors(
        target, config, custom, own["prefix_allowed_tokens_fn"], input_ids, model_kwargs
    )
    sampling = bool(config.do_sample)
    # The caller's processors may hold masks as wide as the target's vocabulary: the draft's logits reach them so wide.
    width = target.get_output_embeddings().weight.shape[0] if custom or own["prefix_allowed_tokens_fn"] else None
    criteria = _stopping_criteria(target, config, own["stopping_criteria"], own["tokenizer"])
    eos_ids = [c.eos_token_id.flatten() for c in criteria if isinstance(c, EosTokenCriteria)]
    limits = [c.max_length for c in criteria if isinstance(c, MaxLengthCriteria)]
    pad = config._pad_token_tensor
    return DecodeSettings(
        # A criterion is checked after a token: one at or below the prompt's length still lets one through.
        max_new_tokens=max(1, min(limits, default=config.max_length) - prompt_length),
        eos_token_ids=torch.cat(eos_ids).to(input_ids.device)
        if eos_ids
        else torch.empty(0, dtype=torch.long, device=input_ids.device),
        sampler=TargetSampler(NodeProcessing(target_processors, sampling=sampling), sampling, generator),
        draft_processing=NodeProcessing(draft_processors, sampling=draft_sampling, width=width)
        if draft_processors
        else None,
        num_sequences=config.num_return_sequences or 1,
        pad_token_id=None if pad is None else int(pad.reshape(-1)[0]),
        stopping=_sorted_criteria(criteria),
        output_scores=bool(config.return_dict_in_generate and config.output_scores),
        output_logits=bool(config.return_dict_in_generate and config.output_logits),
        return_dict_in_generate=bool(config.return_dict_in_generate),
        return_cache=bool(config.return_dict_in_generate and config.use_cache),
    )


def _merged_config(
    target: PreTrainedModel, generation_config: GenerationConfig | None, kwargs: dict[str, Any], input_ids: torch.Tensor
) -> GenerationConfig:
    """The call's config merged as `generate` merges it (checked before and after merging), its lengths set for the
    prompt of `input_ids` and its special tokens prepared."""
    # Fields given for this call (the merged config is checked again below, with the target's own defaults).
    check_fields({**vars(generation_config or GenerationConfig()), **kwargs})
    has_default_max_length = (
        kwargs.get("max_length") is None
        and (generation_config is None or generation_config.max_length is None)
        and target.generation_config.max_length is None
    )
    config, unused = target._prepare_generation_config(generation_config, **kwargs)
    if unused:
        raise TypeError(f"generate() got arguments it does not use: {', '.join(sorted(unused))}")
    check_config(config)
    prompt_length = input_ids.shape[1]
    max_new_tokens = _max_new_tokens(target, config, prompt_length, has_default_max_length)
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_length
    config.max_length = prompt_length + max_new_tokens
    target._prepare_special_tokens(config, kwargs_has_attention_mask=True, device=input_ids.device, batch_size=1)
    return config


def _max_new_tokens(
    target: PreTrainedModel, config: GenerationConfig, prompt_length: int, has_default_max_length: bool
) -> int:
    """New tokens allowed, as `generate` counts them: `max_new_tokens`, else what a set `max_length` leaves after the
    prompt; with none set anywhere, the default `max_length` capped by the positions the prompt leaves."""
    if config.max_new_tokens is not None:
        max_new_tokens = config.max_new_tokens
    elif has_default_max_length:
        limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
        max_new_tokens = config.max_length if limit is None else min(config.max_length, limit - prompt_length)
    else:
        max_new_tokens = config.max_length - prompt_length
    if max_new_tokens <= 0:
        raise ValueError(
            f"Input length of input_ids is {prompt_length}, but `max_length` is set to {config.max_length}: "
            "set `max_new_tokens` instead"
        )
    return max_new_tokens


def _logits_processors(
    target: PreTrainedModel,
    config: GenerationConfig,
    custom: LogitsProcessorList,
    prefix_allowed_tokens_fn: Any,
    input_ids: torch.Tensor,
    model_kwargs: dict[str, Any],
) -> tuple[LogitsProcessorList, LogitsProcessorList, bool]:
    """The target's processors as `generate` builds them with the caller's `custom` ones (checked first), the draft's,
    and whether the draft samples: with a top-k of 1 it ranks greedily under processors built without the warpers."""
    for processor in custom:
        check_processor(processor, input_ids, target)

    def processors(for_config: GenerationConfig) -> LogitsProcessorList:
        return target._get_logits_processor(
            generation_config=for_config,
            input_ids_seq_length=input_ids.shape[1],
            encoder_input_ids=input_ids,
            prefix_allowed_tokens_fn=prefix_allowed_tokens_fn,
            logits_processor=custom,
            device=input_ids.device,
            model_kwargs=model_kwargs,
        )

    target_processors = processors(config)
    if config.do_sample and config.top_k == 1:
        draft_config = copy.copy(config)
        draft_config.do_sample = False
        return target_processors, processors(draft_config), False
    return target_processors, target_processors, bool(config.do_sample)


def _stopping_criteria(
    target: PreTrainedModel, config: GenerationConfig, custom: StoppingCriteriaList | None, tokenizer: Any
) -> StoppingCriteriaList:
    """`generate`'s stopping criteria for `config` merged with the caller's `custom` ones as `generate` merges them
    (a custom criterion of a default's type replaces it)."""
    criteria = StoppingCriteriaList([MaxLengthCriteria(config.max_length)])
    if config.max_time is not None:
        criteria.append(MaxTimeCriteria(config.max_time))
    if config.stop_strings is not None:
        if tokenizer is None:
            raise ValueError(
                "stop_strings need the target's tokenizer to match tokens against: pass tokenizer=processor.tokenizer"
            )
        strings = (config.stop_strings,) if isinstance(config.stop_strings, str) else tuple(config.stop_strings)
        criteria.append(_stop_strings(tokenizer, strings))
    if config._eos_token_tensor is not None:
        criteria.append(EosTokenCriteria(config._eos_token_tensor))
    return target._merge_criteria_processor_list(criteria, StoppingCriteriaList(custom or []))


@functools.lru_cache(maxsize=16)
def _stop_strings(tokenizer: Any, strings: tuple[str, ...]) -> StopStringCriteria:
    """One criterion per tokenizer and stop strings (building one reads the whole vocabulary; prompts decoded
    together with the same strings share it, and so one check on the device)."""
    return StopStringCriteria(tokenizer, list(strings))


def _sorted_criteria(criteria: StoppingCriteriaList) -> Stopping:
    """The criteria besides EOS and the length limit (which the engine settles on the device), by how they are
    checked: stop strings on the device, a time limit on the host's clock, any others once per emitted token."""
    stopping = Stopping()
    for criterion in criteria:
        if isinstance(criterion, (EosTokenCriteria, MaxLengthCriteria)):
            continue
        if type(criterion) is StopStringCriteria and stopping.strings is None:
            stopping.strings = criterion
        elif type(criterion) is MaxTimeCriteria and stopping.deadline is None:
            stopping.deadline = criterion
        else:
            stopping.criteria.append(criterion)
    return stopping


def check_processor(processor: LogitsProcessor, input_ids: torch.Tensor, target: PreTrainedModel) -> None:
    """Refuse a custom logits processor seen to keep state between calls. It is called twice on a copy of the prompt
    (the first call may set up caches); one whose attributes change on the second call assumes one call per generated
    token, while vlmspec calls it for every node of every draft tree and for the draft's proposals too. State held
    elsewhere (a closure, a global) cannot be seen: see docs/generate-contract.md ("Custom processors") on what a
    processor must satisfy."""
    if not callable(processor):
        raise TypeError(f"logits_processor holds {processor!r}, which is not a logits processor")
    vocabulary = target.get_output_embeddings().weight.shape[0]

    def call() -> None:
        processor(input_ids.clone(), torch.zeros(input_ids.shape[0], vocabulary, device=input_ids.device))

    call()
    before = _state(processor)
    call()
    after = _state(processor)
    changed = sorted(k for k in before.keys() | after.keys() if not _same(before.get(k, _MISSING), after.get(k)))
    if changed:
        raise UnsupportedGenerationError(
            f"logits processor {type(processor).__name__} changes its own {', '.join(changed)} each call: vlmspec "
            "calls processors many times per token (for every node of a draft tree, and for the draft's proposals), "
            "so a processor must be a pure function of (input_ids, scores)"
        )


_MISSING = object()


def _state(processor: LogitsProcessor) -> dict[str, Any]:
    """A snapshot of `processor`'s attributes: tensors cloned, lists, dicts and sets copied (one level), other values
    as they are."""
    return {k: _copied(v) for k, v in getattr(processor, "__dict__", {}).items()}


def _copied(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, dict, set)):
        return type(value)(value)
    return value


def _same(a: Any, b: Any) -> bool:
    """Whether two snapshots of an attribute hold the same value."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that cannot be compared count as changed
        return False
