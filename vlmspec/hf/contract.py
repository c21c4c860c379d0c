"""Every argument of `generate` and every field of `GenerationConfig`, as vlmspec honours it.

Each name is applied exactly as `generate` applies it, has no effect on the tokens either way (vlmspec keeps its
own caches, compiles its own forwards and is itself the speculation), or is refused with the reason when it is set.
A field of the installed `GenerationConfig` missing from these tables (one a new `transformers` release adds) is
refused when set, until it is sorted in.
"""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig

from ..errors import UnsupportedGenerationError

#: `generate`'s own parameters that vlmspec applies (`kwargs` carries the model inputs and config fields).
APPLIED_ARGUMENTS = frozenset(
    {
        "inputs",
        "generation_config",
        "logits_processor",
        "stopping_criteria",
        "prefix_allowed_tokens_fn",
        "streamer",
        "synced_gpus",
        "kwargs",
    }
)

#: `generate`'s parameters (and keyword arguments it pops) vlmspec refuses when given, with why.
REFUSED_ARGUMENTS = {
    "assistant_model": "vlmspec is itself speculative decoding: its draft is the one it was built with",
    "assistant_tokenizer": "vlmspec's draft shares the target's tokenizer",
    "negative_prompt_ids": "it serves classifier-free guidance, which vlmspec does not implement",
    "negative_prompt_attention_mask": "it serves classifier-free guidance, which vlmspec does not implement",
    "custom_generate": "a custom decoding loop replaces the one vlmspec speculates in",
}

#: Config fields vlmspec applies as `generate` does.
APPLIED_FIELDS = frozenset(
    {
        "max_length",
        "max_new_tokens",
        "min_length",
        "min_new_tokens",
        "max_time",
        "stop_strings",
        "do_sample",
        "num_beams",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "top_h",
        "typical_p",
        "epsilon_cutoff",
        "eta_cutoff",
        "repetition_penalty",
        "encoder_repetition_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "renormalize_logits",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "sequence_bias",
        "num_return_sequences",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
        "use_cache",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
    }
)

#: Model inputs (parameters of the target's `forward` and outputs of its processor, passed to `generate` through
#: `kwargs`) that vlmspec applies as `generate` does. `past_key_values` is `cache`'s older name, which `generate`
#: still takes.
APPLIED_INPUTS = frozenset(
    {
        "input_ids",
        "attention_mask",
        "inputs_embeds",
        "cache",
        "past_key_values",
        "pixel_values",
        "pixel_values_videos",
        "image_grid_thw",
        "video_grid_thw",
        "second_per_grid_ts",
        "mm_token_type_ids",
        "image_sizes",
        "image_sizes_videos",
        "batch_num_images",
    }
)

#: Model inputs `generate` takes that leave the tokens alone, with why: vlmspec drops them.
NO_EFFECT_INPUTS = {
    "labels": "the forward only computes a loss from them, which generate discards",
    "logits_to_keep": "generate keeps the last position's logits whatever it is",
    "output_router_logits": "the router's logits are returned beside the tokens, never chosen from",
}

#: Model inputs vlmspec refuses when given, with why.
REFUSED_INPUTS = {
    "position_ids": "vlmspec positions the prompt and every draft tree itself, as generate positions them",
    "mm_encoder_outputs": "they are the target's own vision features; the draft encodes the pixels itself",
    "vision_feature_layer": "it overrides the target's vision config for one call, which the draft and pruning "
    "read too: set it on target.config",
    "vision_feature_select_strategy": "it overrides the target's vision config for one call, which the draft and "
    "pruning read too: set it on target.config",
    "vision_aspect_ratio": "it overrides the target's vision config for one call, which the draft and pruning read "
    "too: set it on target.config",
}

#: Config fields that change how `generate` computes, never which tokens it returns, or that serve a decoding mode
#: other than greedy and sampling (beam search's length penalty, assisted decoding's settings) and so leave these
#: tokens alone: vlmspec ignores them.
NO_EFFECT_FIELDS = frozenset(
    {
        "cache_implementation",
        "cache_config",
        "max_cache_len",
        "compile_config",
        "disable_compile",
        "prefill_chunk_size",
        "low_memory",
        "early_stopping",
        "length_penalty",
        "decoder_start_token_id",
        "continuous_batching_config",
        "is_assistant",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "prompt_lookup_num_tokens",
        "max_matching_ngram_size",
        "assistant_early_exit",
        "assistant_lookbehind",
        "target_lookbehind",
        "speculation_type",
        "use_mtp",
        "transformers_version",
        "_from_model_config",
    }
)

_BEAMS = "beam search keeps many hypotheses per row; vlmspec verifies one sequence per row (pass num_beams=1)"
_TREE_FORWARD = (
    "the target's forwards verify draft trees, so their {} cover the tree's nodes (accepted or not), not one "
    "position per emitted token as generate's do"
)

#: Config fields vlmspec refuses when set (to anything but None, False or the value that switches them off), with why.
REFUSED_FIELDS = {
    "output_hidden_states": _TREE_FORWARD.format("hidden states"),
    "output_attentions": _TREE_FORWARD.format("attentions"),
    "guidance_scale": "classifier-free guidance runs a second, unconditional forward per token; vlmspec does not",
    "watermarking_config": "watermarking processors are not checked on draft trees",
    "token_healing": "token healing rewrites the prompt's last tokens before decoding",
    "assistant_ensemble_weight": "it mixes an assistant's logits into the target's, so the output is not the target's",
    "num_beam_groups": _BEAMS,
    "diversity_penalty": _BEAMS,
    "constraints": _BEAMS,
    "force_words_ids": _BEAMS,
    "penalty_alpha": "contrastive search re-ranks candidates by their hidden states; vlmspec samples or takes argmax",
    "dola_layers": "DoLa contrasts the target's layers; vlmspec decodes from its final logits",
}

#: The values of refused fields that switch them off.
_OFF = {"guidance_scale": 1, "num_beam_groups": 1, "diversity_penalty": 0.0, "penalty_alpha": 0.0}


def check_arguments(names: set[str], *, synced_gpus: Any = None) -> None:
    """Refuse `generate` arguments vlmspec cannot honour (`names`: those given, besides model inputs and config)."""
    refused = sorted(names & REFUSED_ARGUMENTS.keys())
    if refused:
        raise UnsupportedGenerationError(f"generate(): {refused[0]} is not supported: {REFUSED_ARGUMENTS[refused[0]]}")
    if synced_gpus:
        raise UnsupportedGenerationError(
            "generate(): synced_gpus=True is not supported: vlmspec decodes each row on one device"
        )


def check_config(config: GenerationConfig) -> None:
    """Refuse a resolved generation config that sets a field vlmspec cannot honour, or one it does not know."""
    check_fields(vars(config))
    known = APPLIED_FIELDS | NO_EFFECT_FIELDS | REFUSED_FIELDS.keys()
    fields = GenerationConfig().to_dict().keys()
    # Attributes that are no field of the installed GenerationConfig (a model's own extras) are ignored, as there.
    for name, value in config.to_diff_dict().items():
        if name in fields and name not in known and value is not None:
            raise UnsupportedGenerationError(
                f"{name}={value!r} is a generation-config field vlmspec has not been checked against; leave it unset"
            )


def check_fields(values: dict[str, Any]) -> None:
    """Refuse the refused fields `values` sets (config fields by name; other names are left alone)."""
    if (values.get("num_beams") or 1) > 1:
        raise UnsupportedGenerationError(f"num_beams={values['num_beams']} is not supported: {_BEAMS}")
    for name, reason in REFUSED_FIELDS.items():
        value = values.get(name)
        if value is not None and value is not False and value != _OFF.get(name):
            raise UnsupportedGenerationError(f"{name}={value!r} is not supported: {reason}")
