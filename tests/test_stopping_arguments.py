"""`stop_strings`, `stopping_criteria` and `max_time` stop decoding where the target's own `generate` stops it: after
the token where a criterion first says so, even inside a step that accepted more; every row of a batch, and every
prompt decoded by `stream`, where its own `generate` stops."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES
from test_batch import padded_batch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import ConfidenceCriteria, MaxLengthCriteria, StopStringCriteria

from vlmspec import SpeculativeVLM, UnsupportedGenerationError
from vlmspec.eval.profile import EndsWithToken

FAMILY = FAMILIES["qwen2_5_vl"]
NEW_TOKENS = 24


def continuation(case: str) -> torch.Tensor:
    """The target's greedy new tokens for `case`."""
    return FAMILY.reference(case, NEW_TOKENS)[0, FAMILY.cases[case]["input_ids"].shape[1] :]


def stop_string(case: str, at: int) -> str:
    """Text that ends the target's greedy continuation of `case` at its `at`-th token or the first printable one
    after it: that token's text, with the one before when both are printable."""
    decode = FAMILY.processor.tokenizer.decode
    tokens = continuation(case).tolist()
    for j in range(at, len(tokens)):
        text = decode(tokens[j : j + 1])
        if text.isascii() and text.isprintable() and any(c.isalnum() for c in text) and "<|" not in text:
            pair = decode(tokens[j - 1 : j + 1]) if j > 0 else text
            return pair if pair.isascii() and pair.isprintable() else text
    raise AssertionError(f"no printable token after {at} in {case}'s continuation")


def new_tokens(out: torch.Tensor, case: str) -> int:
    return out.shape[1] - FAMILY.cases[case]["input_ids"].shape[1]


@pytest.mark.parametrize("policy", ["chain", "static-tree", "sage", "auto"])
@pytest.mark.parametrize("case", ["image", "video"])
def test_a_stop_string_ends_decoding_where_generate_ends_it(policy, case):
    kwargs = dict(
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        stop_strings=[stop_string(case, 9)],
        tokenizer=FAMILY.processor.tokenizer,
    )
    expected = FAMILY.target.generate(**FAMILY.cases[case], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy).generate(**FAMILY.cases[case], **kwargs)
    assert torch.equal(got, expected)
    assert new_tokens(got, case) < NEW_TOKENS


def test_a_stop_string_inside_an_accepted_path_cuts_the_path_there():
    """A self-draft has every drafted token accepted: the stop lands inside a step's accepted tokens."""
    kwargs = dict(
        max_new_tokens=NEW_TOKENS, stop_strings=[stop_string("image", 10)], tokenizer=FAMILY.processor.tokenizer
    )
    expected = FAMILY.target.generate(**FAMILY.cases["image"], do_sample=False, **kwargs)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.target, "chain", pruning=None)
    got = spec.generate(**FAMILY.cases["image"], **kwargs)
    assert torch.equal(got, expected)
    steps = spec.last_stats.steps
    assert steps[-1].accepted + 1 > new_tokens(got, "image") - 1 - sum(s.accepted + 1 for s in steps[:-1])


def test_a_stop_string_in_the_first_token_ends_at_the_prefill():
    kwargs = dict(
        max_new_tokens=NEW_TOKENS, stop_strings=[stop_string("text", 0)], tokenizer=FAMILY.processor.tokenizer
    )
    expected = FAMILY.target.generate(**FAMILY.cases["text"], do_sample=False, **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**FAMILY.cases["text"], **kwargs)
    assert torch.equal(got, expected)


def test_stop_strings_take_the_pairs_own_tokenizer_by_default():
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stop_strings=[stop_string("image", 9)])
    expected = FAMILY.target.generate(**FAMILY.cases["image"], tokenizer=FAMILY.processor.tokenizer, **kwargs)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], processor=FAMILY.processor)
    assert torch.equal(spec.generate(**FAMILY.cases["image"], **kwargs), expected)
    assert new_tokens(expected, "image") < NEW_TOKENS


def test_stop_strings_without_a_tokenizer_ask_for_one():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    with pytest.raises(ValueError, match="tokenizer"):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, stop_strings=["x"])


@pytest.mark.parametrize("policy", ["chain", "sage"])
def test_a_python_stopping_criterion_stops_where_generate_stops(policy):
    criteria = StoppingCriteriaList([EndsWithToken(int(continuation("image")[11]))])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria)
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy).generate(**FAMILY.cases["image"], **kwargs)
    assert torch.equal(got, expected)
    assert new_tokens(got, "image") < NEW_TOKENS


def test_a_stop_string_criterion_passed_as_a_criterion_is_checked_on_the_device_too():
    criterion = StopStringCriteria(FAMILY.processor.tokenizer, [stop_string("video", 8)])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stopping_criteria=StoppingCriteriaList([criterion]))
    expected = FAMILY.target.generate(**FAMILY.cases["video"], **kwargs)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage")
    assert torch.equal(spec.generate(**FAMILY.cases["video"], **kwargs), expected)


def test_a_custom_max_length_criterion_replaces_the_budget_as_in_generate():
    prompt = FAMILY.cases["text"]["input_ids"].shape[1]
    criteria = StoppingCriteriaList([MaxLengthCriteria(prompt + 5)])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria)
    expected = FAMILY.target.generate(**FAMILY.cases["text"], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**FAMILY.cases["text"], **kwargs)
    assert torch.equal(got, expected) and new_tokens(got, "text") == 5


def test_a_custom_max_length_criterion_below_the_prompt_still_lets_one_token_through():
    prompt = FAMILY.cases["text"]["input_ids"].shape[1]
    criteria = StoppingCriteriaList([MaxLengthCriteria(prompt - 2)])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria)
    expected = FAMILY.target.generate(**FAMILY.cases["text"], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**FAMILY.cases["text"], **kwargs)
    assert torch.equal(got, expected) and new_tokens(got, "text") == 1


def test_a_callers_confidence_criterion_is_applied_as_generate_applies_it():
    criteria = StoppingCriteriaList([ConfidenceCriteria(0.99)])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria)
    kwargs |= dict(return_dict_in_generate=True, output_scores=True)
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**FAMILY.cases["image"], **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert new_tokens(got.sequences, "image") < NEW_TOKENS


def test_max_time_once_passed_stops_after_the_next_token_as_in_generate():
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, max_time=0.0)
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**FAMILY.cases["image"], **kwargs)
    assert torch.equal(got, expected) and new_tokens(got, "image") == 1


@pytest.mark.parametrize("policy", ["auto", "chain", "sage", "sage-gt"])
def test_every_row_of_a_batch_stops_where_its_own_generate_stops(policy):
    rows = ("text", "image", "video")
    batch = padded_batch(FAMILY, rows)
    width = batch["input_ids"].shape[1]
    tokenizer = FAMILY.processor.tokenizer
    strings = [stop_string("text", 5), stop_string("video", 14)]
    criteria = StoppingCriteriaList([EndsWithToken(int(continuation("image")[9]))])
    kwargs = dict(
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        stop_strings=strings,
        tokenizer=tokenizer,
        stopping_criteria=criteria,
    )
    expected = FAMILY.target.generate(**batch, **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy).generate(**batch, **kwargs)
    assert torch.equal(got, expected)
    pad = FAMILY.target.generation_config.pad_token_id
    lengths = []
    for b, case in enumerate(rows):
        alone = FAMILY.target.generate(**FAMILY.cases[case], **kwargs)
        own = alone.shape[1] - FAMILY.cases[case]["input_ids"].shape[1]
        assert torch.equal(got[b, width : width + own], alone[0, -own:])
        assert bool((got[b, width + own :] == pad).all())
        lengths.append(own)
    assert len(set(lengths)) == len(rows)


def test_a_batch_with_stop_criteria_and_no_eos_is_refused_naming_why():
    """Without an EOS `generate` keeps decoding a stopped row until every row stops, rather than padding it."""
    batch = padded_batch(FAMILY, ("text", "image"))
    tokenizer = FAMILY.processor.tokenizer
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    with pytest.raises(UnsupportedGenerationError, match="without an eos_token_id"):
        spec.generate(**batch, max_new_tokens=8, eos_token_id=None, stop_strings=["x"], tokenizer=tokenizer)


def test_stream_stops_each_prompt_with_its_own_criteria_as_its_own_generate():
    tokenizer = FAMILY.processor.tokenizer
    prompts = {
        "text": dict(stop_strings=[stop_string("text", 6)]),
        "image": dict(stopping_criteria=StoppingCriteriaList([EndsWithToken(int(continuation("image")[4]))])),
        "video": dict(stop_strings=[stop_string("video", 12)]),
        "two_images": {},
    }
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    results = spec.stream(
        ((case, FAMILY.cases[case], options) for case, options in prompts.items()),
        batch_size=2,
        do_sample=False,
        max_new_tokens=NEW_TOKENS,
        tokenizer=tokenizer,
    )
    for result in results:
        assert result.error is None
        own = prompts[result.key]
        expected = FAMILY.target.generate(
            **FAMILY.cases[result.key], do_sample=False, max_new_tokens=NEW_TOKENS, tokenizer=tokenizer, **own
        )
        assert torch.equal(result.sequence, expected), result.key


def test_sampled_rows_end_at_their_first_stop_and_nowhere_earlier():
    """Sampled continuations stop where `generate` would: the stop string ends each one that is cut short, and
    no shorter prefix of it ends with one."""
    tokenizer = FAMILY.processor.tokenizer
    strings = [tokenizer.decode([t]) for t in continuation("image")[2:6].tolist()]
    criterion = StopStringCriteria(tokenizer, strings)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage")
    out = spec.generate(
        **FAMILY.cases["image"],
        do_sample=True,
        temperature=1.5,
        top_k=8,
        max_new_tokens=12,
        num_return_sequences=24,
        stop_strings=strings,
        tokenizer=tokenizer,
        generator=torch.Generator().manual_seed(0),
    )
    prompt = FAMILY.cases["image"]["input_ids"].shape[1]
    pad = FAMILY.target.generation_config.pad_token_id
    eos = FAMILY.target.generation_config.eos_token_id
    stopped = 0
    for row in out:
        new = row[prompt:]
        length = len(new) - int((new == pad).flip(0).cumprod(0).sum())
        ends = [bool(criterion(row[None, : prompt + j], None)) for j in range(1, length + 1)]
        assert not any(ends[:-1])
        ended_by_eos = int(new[length - 1]) in ([eos] if isinstance(eos, int) else eos)
        assert ends[-1] or ended_by_eos or length == 12
        stopped += ends[-1]
    assert stopped > 0
