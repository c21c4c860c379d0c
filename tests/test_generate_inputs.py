"""The model inputs `generate` takes through its keyword arguments: every input of each family's `forward` and
processor is applied as `generate` applies it, leaves the tokens alone, or is refused by name. Embeddings in place of
ids, a cache returned and a conversation going on from it decode as the target's own `generate` does."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import FAMILIES, on_device

from vlmspec import SpeculativeCache, SpeculativeVLM, UnsupportedGenerationError
from vlmspec.adapters import adapter_for
from vlmspec.hf.contract import APPLIED_INPUTS, NO_EFFECT_INPUTS, REFUSED_INPUTS
from vlmspec.hf.model_inputs import forward_inputs

NEW_TOKENS = 12
NEXT_TURN = "\nuser: and what else is there?\nassistant:"

#: Per refused input, a value that gives it.
REFUSED_VALUES = {
    "position_ids": lambda ids: torch.arange(ids.shape[1], device=ids.device)[None],
    "mm_encoder_outputs": lambda ids: (torch.zeros(1, 4),),
    "vision_feature_layer": lambda ids: -2,
    "vision_feature_select_strategy": lambda ids: "full",
    "vision_aspect_ratio": lambda ids: "anyres_max_9",
}

#: Per input without effect, a value that gives it.
NO_EFFECT_VALUES = {
    "labels": lambda ids: ids,
    "logits_to_keep": lambda ids: 0,
    "output_router_logits": lambda ids: True,
}


def _spec(family) -> SpeculativeVLM:
    return SpeculativeVLM(family.target, family.drafts["noisy"], "sage", processor=family.processor)


def _embedded(family, case: str) -> tuple[dict, torch.Tensor]:
    inputs = dict(family.cases[case])
    return inputs, family.target.get_input_embeddings()(inputs["input_ids"])


def _next_turn(family, case: str, sequences: torch.Tensor) -> dict:
    """The conversation's next turn after `case`'s first: its ids so far, a new user message, and their token inputs
    (no visual ones: the cached turn holds its images), as `generate` goes on from a cache."""
    tokenizer = family.processor.tokenizer
    new = tokenizer(NEXT_TURN, return_tensors="pt").input_ids.to(sequences.device)
    ids = torch.cat([sequences, new.expand(sequences.shape[0], -1)], 1)
    turn = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    types = family.cases[case].get("mm_token_type_ids")
    if types is not None:
        turn["mm_token_type_ids"] = torch.cat([types, types.new_zeros(1, ids.shape[1] - types.shape[1])], 1)
    return turn


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_model_input_of_each_family_is_applied_ignored_or_refused(name):
    family = FAMILIES[name]
    given = forward_inputs(family.target) | {key for case in family.cpu_cases.values() for key in case}
    given -= {"use_cache"}  # a generation-config field, sorted with the others
    tables = [APPLIED_INPUTS, NO_EFFECT_INPUTS.keys(), REFUSED_INPUTS.keys()]
    assert {n for n in given if sum(n in table for table in tables) != 1} == set()


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("case", ["text", "image"])
def test_embeddings_with_their_ids_decode_as_generate(name, case):
    family = FAMILIES[name]
    inputs, embeds = _embedded(family, case)
    expected = family.target.generate(**inputs, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    got = _spec(family).generate(**inputs, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("case", ["text", "image"])
def test_embeddings_alone_decode_as_generate_and_return_only_new_tokens(name, case):
    family = FAMILIES[name]
    inputs, embeds = _embedded(family, case)
    del inputs["input_ids"]
    expected = family.target.generate(**inputs, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    got = _spec(family).generate(**inputs, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert got.shape == (1, NEW_TOKENS) and torch.equal(got, expected)


def test_embeddings_of_another_vector_than_a_tokens_decode_as_generate():
    """A soft prompt: the target reads the embeddings as given; the draft reads their nearest tokens."""
    family = FAMILIES["qwen2_5_vl"]
    inputs, embeds = _embedded(family, "text")
    embeds = embeds + 0.01 * torch.randn(embeds.shape, generator=torch.Generator().manual_seed(0)).to(embeds)
    expected = family.target.generate(**inputs, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    got = _spec(family).generate(**inputs, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected)


def test_a_padded_batch_of_embeddings_equals_each_rows_own_generate():
    family = FAMILIES["qwen2_5_vl"]
    adapter = adapter_for(family.target)
    batch = on_device(adapter.join_rows([family.cpu_cases["text"], family.cpu_cases["long_prompt"]], 0))
    embeds = family.target.get_input_embeddings()(batch["input_ids"])
    got = _spec(family).generate(**batch, inputs_embeds=embeds, do_sample=False, max_new_tokens=NEW_TOKENS)
    for b, case in enumerate(["text", "long_prompt"]):
        alone = family.reference(case, NEW_TOKENS)
        assert torch.equal(got[b, got.shape[1] - alone.shape[1] :], alone[0]), case


def test_embeddings_sampled_draw_the_same_tokens_as_their_ids_for_the_same_seed():
    """Embeddings equal to the ids' run the target's very computation: with one seed, the same draws (whose
    distribution the sampling tests check against `generate`'s)."""
    family = FAMILIES["qwen2_5_vl"]
    inputs, embeds = _embedded(family, "image")
    spec = _spec(family)
    kwargs = dict(do_sample=True, temperature=1.5, max_new_tokens=NEW_TOKENS, num_return_sequences=8)
    by_ids = spec.generate(**inputs, generator=torch.Generator().manual_seed(3), **kwargs)
    by_embeds = spec.generate(**inputs, inputs_embeds=embeds, generator=torch.Generator().manual_seed(3), **kwargs)
    assert torch.equal(by_ids, by_embeds) and len({tuple(row.tolist()) for row in by_ids}) > 1


@pytest.mark.parametrize("name", ["qwen2_5_vl", "llava_onevision", "qwen3_vl_moe"])
def test_an_input_without_effect_leaves_the_tokens_alone(name):
    family = FAMILIES[name]
    spec = _spec(family)
    inputs = family.cases["image"]
    for input_name in sorted(NO_EFFECT_INPUTS.keys() & forward_inputs(family.target)):
        value = NO_EFFECT_VALUES[input_name](inputs["input_ids"])
        got = spec.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS, **{input_name: value})
        assert torch.equal(got, family.reference("image", NEW_TOKENS)), input_name


@pytest.mark.parametrize("name", ["qwen2_5_vl", "llava_onevision"])
def test_a_refused_input_is_named_in_its_error(name):
    family = FAMILIES[name]
    spec = _spec(family)
    inputs = family.cases["image"]
    for input_name in sorted(REFUSED_INPUTS.keys() & forward_inputs(family.target)):
        with pytest.raises(UnsupportedGenerationError, match=input_name):
            spec.generate(**inputs, max_new_tokens=4, **{input_name: REFUSED_VALUES[input_name](inputs["input_ids"])})


def test_a_refusal_comes_before_the_check_for_ids():
    family = FAMILIES["qwen2_5_vl"]
    inputs, embeds = _embedded(family, "text")
    del inputs["input_ids"]
    with pytest.raises(UnsupportedGenerationError, match="num_beams"):
        _spec(family).generate(**inputs, inputs_embeds=embeds, num_beams=2, max_new_tokens=4)


def test_a_call_without_ids_or_embeddings_names_both():
    with pytest.raises(ValueError, match="input_ids or inputs_embeds"):
        _spec(FAMILIES["qwen2_5_vl"]).generate(max_new_tokens=4)


def test_a_right_padded_batch_is_refused_naming_the_attention_mask():
    family = FAMILIES["qwen2_5_vl"]
    ids = family.cases["text"]["input_ids"].expand(2, -1).clone()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    with pytest.raises(UnsupportedGenerationError, match="attention_mask.*padding_side"):
        _spec(family).generate(input_ids=ids, attention_mask=mask, max_new_tokens=4)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_returned_cache_holds_the_targets_keys_for_all_but_the_last_token(name):
    family = FAMILIES[name]
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True)
    expected = family.target.generate(**family.cases["image"], **kwargs)
    got = _spec(family).generate(**family.cases["image"], **kwargs)
    assert torch.equal(got.sequences, expected.sequences) and isinstance(got.past_key_values, SpeculativeCache)
    assert got.past_key_values.get_seq_length() == got.sequences.shape[1] - 1
    for mine, theirs in zip(got.past_key_values.layers, expected.past_key_values.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-4)


def test_no_cache_is_returned_without_use_cache_as_generate_returns_none():
    family = FAMILIES["qwen2_5_vl"]
    out = _spec(family).generate(
        **family.cases["text"], max_new_tokens=4, return_dict_in_generate=True, use_cache=False, do_sample=False
    )
    assert out.past_key_values is None


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("case", ["text", "image"])
def test_the_next_turn_from_the_returned_cache_equals_generate_going_on_from_its_own(name, case):
    family = FAMILIES[name]
    kwargs = dict(do_sample=False, max_new_tokens=8, return_dict_in_generate=True)
    theirs = family.target.generate(**family.cases[case], **kwargs)
    mine = _spec(family).generate(**family.cases[case], **kwargs)
    turn = _next_turn(family, case, theirs.sequences)
    expected = family.target.generate(**turn, cache=theirs.cache, do_sample=False, max_new_tokens=10)
    spec = _spec(family)
    got = spec.generate(**turn, past_key_values=mine.past_key_values, do_sample=False, max_new_tokens=10)
    assert torch.equal(got, expected)
    assert spec.last_stats.target_prefill_tokens == turn["input_ids"].shape[1] - mine.sequences.shape[1] + 1


@pytest.mark.parametrize("name", ["qwen2_5_vl", "llava_onevision"])
def test_generate_goes_on_from_the_returned_cache_and_vlmspec_from_generates(name):
    family = FAMILIES[name]
    kwargs = dict(do_sample=False, max_new_tokens=8, return_dict_in_generate=True)
    theirs = family.target.generate(**family.cases["image"], **kwargs)
    mine = _spec(family).generate(**family.cases["image"], **kwargs)
    turn = _next_turn(family, "image", theirs.sequences)
    own = family.target.generate(**turn, cache=copy.deepcopy(theirs.cache), max_new_tokens=10)
    from_mine = family.target.generate(**turn, cache=copy.deepcopy(mine.cache), max_new_tokens=10)
    from_theirs = _spec(family).generate(**turn, cache=theirs.cache, max_new_tokens=10)
    assert torch.equal(from_mine, own) and torch.equal(from_theirs, own)


def test_a_padded_batch_returns_a_cache_its_next_turn_goes_on_from():
    family = FAMILIES["qwen2_5_vl"]
    adapter = adapter_for(family.target)
    batch = on_device(adapter.join_rows([family.cpu_cases["text"], family.cpu_cases["long_prompt"]], 0))
    kwargs = dict(do_sample=False, max_new_tokens=8, return_dict_in_generate=True)
    mine = _spec(family).generate(**batch, **kwargs)
    assert torch.equal(mine.sequences, family.target.generate(**batch, **kwargs).sequences)
    new = family.processor.tokenizer(NEXT_TURN, return_tensors="pt").input_ids.to(batch["input_ids"].device)
    ids = torch.cat([mine.sequences, new.expand(2, -1)], 1)
    mask = torch.cat([batch["attention_mask"], torch.ones(2, ids.shape[1] - batch["attention_mask"].shape[1])], 1)
    got = _spec(family).generate(input_ids=ids, attention_mask=mask.long(), cache=mine.cache)
    for b in range(2):
        start = int((mask[b] == 0).sum())
        alone = family.target.generate(input_ids=ids[b : b + 1, start:], do_sample=False, max_new_tokens=20)
        assert torch.equal(got[b, start:], alone[0])


def test_a_cache_with_the_cached_turns_images_is_refused_by_name():
    family = FAMILIES["qwen2_5_vl"]
    out = _spec(family).generate(**family.cases["image"], max_new_tokens=4, return_dict_in_generate=True)
    turn = {**family.cases["image"], **_next_turn(family, "image", out.sequences)}
    with pytest.raises(UnsupportedGenerationError, match=r"past_key_values\) with .*pixel_values"):
        _spec(family).generate(**turn, cache=out.cache, max_new_tokens=4)


def test_a_stream_refuses_embeddings_and_caches_by_name():
    family = FAMILIES["qwen2_5_vl"]
    inputs, embeds = _embedded(family, "text")
    with pytest.raises(UnsupportedGenerationError, match="inputs_embeds"):
        _spec(family).prepare({**inputs, "inputs_embeds": embeds}, max_new_tokens=4)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_sequence_its_first_token_ends_returns_the_cache_of_its_prompt(rows):
    """One prompt alone, or two prefilled together in one forward: the cache is the prompt's keys."""
    family = FAMILIES["qwen2_5_vl"]
    inputs = {k: v.expand(rows, *v.shape[1:]) for k, v in family.cases["text"].items()}
    kwargs = dict(do_sample=False, max_new_tokens=1, return_dict_in_generate=True)
    expected = family.target.generate(**inputs, **kwargs)
    got = _spec(family).generate(**inputs, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert got.cache.get_seq_length() == inputs["input_ids"].shape[1]
    for mine, theirs in zip(got.cache.layers, expected.cache.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
