"""Every argument of `generate` and field of `GenerationConfig` either decodes exactly as the target's own `generate`
with the same arguments, leaves the tokens alone, or is refused with an error naming it; the tables come from the
installed `transformers`, so a name a new release adds fails here until it is sorted and tested."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import FAMILIES
from transformers import (
    CompileConfig,
    GenerationConfig,
    StoppingCriteriaList,
    WatermarkingConfig,
)
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.utils import GenerationMixin

from vlmspec import SpeculativeVLM, UnsupportedGenerationError
from vlmspec.hf import contract
from vlmspec.hf.contract import (
    APPLIED_ARGUMENTS,
    APPLIED_FIELDS,
    NO_EFFECT_FIELDS,
    REFUSED_ARGUMENTS,
    REFUSED_FIELDS,
)

FAMILY = FAMILIES["qwen2_5_vl"]
NEW_TOKENS = 10


def _new(case: str, at: int) -> int:
    """The token the target's greedy `generate` emits `at` tokens into `case`'s continuation."""
    reference = FAMILY.reference(case, 24)
    return int(reference[0, FAMILY.cases[case]["input_ids"].shape[1] + at])


def _applied_cases() -> dict[str, dict]:
    """Per applied field, generate arguments that make it matter on the text prompt (sampling fields under a top-k of
    1, which keeps them deterministic; their distributions are tested in test_sampling)."""
    prompt = FAMILY.cases["text"]["input_ids"].shape[1]
    eos = _new("text", 3)
    one = dict(do_sample=True, top_k=1)
    return {
        "max_length": dict(max_length=prompt + 7, max_new_tokens=None),
        "max_new_tokens": dict(max_new_tokens=7),
        "min_length": dict(min_length=prompt + 6, eos_token_id=eos),
        "min_new_tokens": dict(min_new_tokens=6, eos_token_id=eos),
        "max_time": dict(max_time=600.0),
        "stop_strings": dict(stop_strings=[FAMILY.processor.tokenizer.decode([_new("text", 4)])]),
        "do_sample": one,
        "num_beams": dict(num_beams=1),
        "temperature": dict(one, temperature=0.5),
        "top_k": one,
        "top_p": dict(one, top_p=0.5),
        "min_p": dict(one, min_p=0.2),
        "top_h": dict(one, top_h=0.5),
        "typical_p": dict(one, typical_p=0.5),
        "epsilon_cutoff": dict(one, epsilon_cutoff=0.01),
        "eta_cutoff": dict(one, eta_cutoff=0.01),
        "repetition_penalty": dict(repetition_penalty=1.5),
        "encoder_repetition_penalty": dict(encoder_repetition_penalty=1.5),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=2),
        "encoder_no_repeat_ngram_size": dict(encoder_no_repeat_ngram_size=2),
        "bad_words_ids": dict(bad_words_ids=[[_new("text", 2)]]),
        "renormalize_logits": dict(renormalize_logits=True),
        "forced_bos_token_id": dict(forced_bos_token_id=_new("text", 5)),
        "forced_eos_token_id": dict(forced_eos_token_id=eos, eos_token_id=eos),
        "remove_invalid_values": dict(remove_invalid_values=True),
        "exponential_decay_length_penalty": dict(exponential_decay_length_penalty=(2, 3.0), eos_token_id=eos),
        "suppress_tokens": dict(suppress_tokens=[_new("text", 1), _new("text", 2)]),
        "begin_suppress_tokens": dict(begin_suppress_tokens=[_new("text", 0)]),
        "sequence_bias": dict(sequence_bias={(_new("text", 6),): 4.0}),
        "num_return_sequences": dict(one, num_return_sequences=2),
        "output_scores": dict(return_dict_in_generate=True, output_scores=True),
        "output_logits": dict(return_dict_in_generate=True, output_logits=True),
        "return_dict_in_generate": dict(return_dict_in_generate=True),
        "use_cache": dict(return_dict_in_generate=True, use_cache=False),
        "pad_token_id": dict(one, pad_token_id=_new("text", 7), eos_token_id=eos, num_return_sequences=2),
        "bos_token_id": dict(bos_token_id=_new("text", 5)),
        "eos_token_id": dict(eos_token_id=eos),
    }


#: Per field without effect, a value `generate` accepts.
NO_EFFECT_VALUES = {
    "cache_implementation": "static",
    "cache_config": {},
    "max_cache_len": 512,
    "compile_config": CompileConfig(),
    "disable_compile": True,
    "prefill_chunk_size": 8,
    "low_memory": True,
    "early_stopping": True,
    "length_penalty": 2.0,
    "decoder_start_token_id": 0,
    "continuous_batching_config": ContinuousBatchingConfig(),
    "is_assistant": True,
    "num_assistant_tokens": 3,
    "num_assistant_tokens_schedule": "constant",
    "assistant_confidence_threshold": 0.5,
    "prompt_lookup_num_tokens": 3,
    "max_matching_ngram_size": 2,
    "assistant_early_exit": 1,
    "assistant_lookbehind": 5,
    "target_lookbehind": 5,
    "speculation_type": "prompt_lookup",
    "use_mtp": True,
    "transformers_version": "0",
    "_from_model_config": True,
}

#: Per refused field, a value that switches it on.
REFUSED_VALUES = {
    "output_hidden_states": True,
    "output_attentions": True,
    "guidance_scale": 1.5,
    "watermarking_config": WatermarkingConfig(),
    "token_healing": True,
    "assistant_ensemble_weight": 0.5,
    "num_beam_groups": 2,
    "diversity_penalty": 0.5,
    "constraints": ["a constraint"],
    "force_words_ids": [[1]],
    "penalty_alpha": 0.6,
    "dola_layers": "low",
}

#: Per refused argument of `generate`, a value that gives it.
REFUSED_ARGUMENT_VALUES = {
    "assistant_model": FAMILY.drafts["noisy"],
    "assistant_tokenizer": FAMILY.processor.tokenizer,
    "negative_prompt_ids": torch.ones(1, 2, dtype=torch.long),
    "negative_prompt_attention_mask": torch.ones(1, 2, dtype=torch.long),
    "custom_generate": "some/repo",
}


def _ids(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.sequences


def test_every_parameter_of_generate_is_applied_or_refused():
    parameters = set(inspect.signature(GenerationMixin.generate).parameters) - {"self"}
    assert parameters - APPLIED_ARGUMENTS - REFUSED_ARGUMENTS.keys() == set()


def test_every_generation_config_field_is_applied_ignored_or_refused():
    fields = set(GenerationConfig().to_dict())
    sorted_in = APPLIED_FIELDS | NO_EFFECT_FIELDS | REFUSED_FIELDS.keys()
    assert fields - sorted_in == set()
    assert not (APPLIED_FIELDS & NO_EFFECT_FIELDS) and not (APPLIED_FIELDS & REFUSED_FIELDS.keys())


@pytest.mark.parametrize("name", sorted(APPLIED_FIELDS))
def test_an_applied_field_decodes_as_generate_does(name):
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False) | _applied_cases()[name]
    if "stop_strings" in kwargs:
        kwargs["tokenizer"] = FAMILY.processor.tokenizer
    inputs = FAMILY.cases["text"]
    expected = FAMILY.target.generate(**inputs, **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain").generate(**inputs, **kwargs)
    assert torch.equal(_ids(got), _ids(expected))
    if kwargs.get("return_dict_in_generate"):
        assert (got.cache is None) == (expected.cache is None)
    for output in ("scores", "logits"):
        if kwargs.get(f"output_{output}"):
            assert len(getattr(got, output)) == len(getattr(expected, output))
            for mine, theirs in zip(getattr(got, output), getattr(expected, output), strict=True):
                torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(NO_EFFECT_FIELDS))
def test_a_field_without_effect_leaves_the_tokens_alone(name):
    inputs = FAMILY.cases["text"]
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    got = spec.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, **{name: NO_EFFECT_VALUES[name]})
    assert torch.equal(got, FAMILY.reference("text", NEW_TOKENS))


@pytest.mark.parametrize("name", sorted(REFUSED_FIELDS))
def test_a_refused_field_is_named_in_its_error(name):
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    with pytest.raises(UnsupportedGenerationError, match=name):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, **{name: REFUSED_VALUES[name]})


@pytest.mark.parametrize("name", sorted(REFUSED_FIELDS))
def test_a_refused_field_in_a_generation_config_is_named_too(name):
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    config = GenerationConfig(max_new_tokens=4)
    setattr(config, name, REFUSED_VALUES[name])
    with pytest.raises(UnsupportedGenerationError, match=name):
        spec.generate(**FAMILY.cases["text"], generation_config=config)


@pytest.mark.parametrize("name", sorted(REFUSED_ARGUMENTS))
def test_a_refused_argument_is_named_in_its_error(name):
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    with pytest.raises(UnsupportedGenerationError, match=name):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, **{name: REFUSED_ARGUMENT_VALUES[name]})


def test_synced_gpus_is_refused_by_name():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    with pytest.raises(UnsupportedGenerationError, match="synced_gpus"):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, synced_gpus=True)


def test_a_config_field_vlmspec_has_not_sorted_is_refused_by_name(monkeypatch):
    """As a field a new release adds would be: here one taken out of the tables."""
    monkeypatch.setattr(contract, "APPLIED_FIELDS", APPLIED_FIELDS - {"top_h"})
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    with pytest.raises(UnsupportedGenerationError, match="top_h"):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, do_sample=True, top_h=0.5)


def test_a_models_own_extra_config_attribute_is_ignored_as_generate_ignores_it():
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False)
    config.chat_format = "chatml"
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    assert torch.equal(
        spec.generate(**FAMILY.cases["text"], generation_config=config), FAMILY.reference("text", NEW_TOKENS)
    )


@pytest.mark.parametrize("name", sorted(REFUSED_ARGUMENTS))
def test_a_refused_argument_given_as_none_is_accepted(name):
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    got = spec.generate(**FAMILY.cases["text"], max_new_tokens=NEW_TOKENS, do_sample=False, **{name: None})
    assert torch.equal(got, FAMILY.reference("text", NEW_TOKENS))


def test_an_argument_overrides_a_refused_value_of_the_config_it_is_given_with():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    config = GenerationConfig(num_beams=2, max_new_tokens=NEW_TOKENS, do_sample=False)
    got = spec.generate(**FAMILY.cases["text"], generation_config=config, num_beams=1)
    assert torch.equal(got, FAMILY.reference("text", NEW_TOKENS))


def test_trust_remote_code_is_accepted_as_generate_accepts_it():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    got = spec.generate(**FAMILY.cases["text"], max_new_tokens=NEW_TOKENS, do_sample=False, trust_remote_code=True)
    assert torch.equal(got, FAMILY.reference("text", NEW_TOKENS))


def test_a_max_length_at_or_below_the_prompt_is_refused_as_generate_refuses_it():
    prompt = FAMILY.cases["text"]["input_ids"].shape[1]
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    with pytest.raises(ValueError, match="max_length"):
        spec.generate(**FAMILY.cases["text"], max_length=prompt, max_new_tokens=None)


def test_inputs_is_taken_as_input_ids_as_generate_takes_it():
    inputs = dict(FAMILY.cases["text"])
    ids = inputs.pop("input_ids")
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    got = spec.generate(inputs=ids, **inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(got, FAMILY.reference("text", NEW_TOKENS))


def test_stopping_criteria_and_max_time_given_as_arguments_are_applied():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "chain")
    got = spec.generate(
        **FAMILY.cases["text"], max_new_tokens=NEW_TOKENS, stopping_criteria=StoppingCriteriaList(), max_time=600.0
    )
    assert torch.equal(got, FAMILY.reference("text", NEW_TOKENS))
