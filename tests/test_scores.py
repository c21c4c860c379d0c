"""`output_scores` and `output_logits` return, for each emitted token, the tensors the target's own `generate` returns:
the processed scores and raw logits at the position that chose it, taken from the verification forward that
accepted it, for every row of a batch; hidden states and attentions are refused, naming the argument."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES
from test_batch import padded_batch
from transformers import LogitsProcessorList

from vlmspec import SpeculativeVLM, UnsupportedGenerationError
from vlmspec.testing.distribution import extend_inputs

FAMILY = FAMILIES["qwen2_5_vl"]
NEW_TOKENS = 16
OUTPUTS = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)


def assert_steps_close(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...], rows=slice(None)) -> None:
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine[rows], theirs[rows], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["chain", "static-tree", "sage", "sage-gt"])
@pytest.mark.parametrize("case", ["image", "video"])
def test_greedy_scores_and_logits_are_generates(policy, case):
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, repetition_penalty=1.3, no_repeat_ngram_size=3, **OUTPUTS)
    expected = FAMILY.target.generate(**FAMILY.cases[case], **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy).generate(**FAMILY.cases[case], **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert_steps_close(got.scores, expected.scores)
    assert_steps_close(got.logits, expected.logits)


def test_scores_include_a_custom_processor_as_generates_do():
    from test_custom_processors import AlternatingParity

    kwargs = dict(
        do_sample=False, max_new_tokens=NEW_TOKENS, logits_processor=LogitsProcessorList([AlternatingParity()])
    )
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs, **OUTPUTS)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**FAMILY.cases["image"], **kwargs, **OUTPUTS)
    assert_steps_close(got.scores, expected.scores)


def test_every_row_of_a_batch_has_its_own_scores_up_to_where_it_stopped():
    rows = ("text", "image", "video")
    batch = padded_batch(FAMILY, rows)
    width = batch["input_ids"].shape[1]
    eos = int(FAMILY.reference("image", 24)[0, FAMILY.cases["image"]["input_ids"].shape[1] + 5])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos, repetition_penalty=1.2, **OUTPUTS)
    expected = FAMILY.target.generate(**batch, **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage").generate(**batch, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores)
    for b in range(len(rows)):
        emitted = got.sequences[b, width:]
        ends = (emitted == eos).nonzero()
        length = int(ends[0]) + 1 if len(ends) else NEW_TOKENS
        for i in range(len(got.scores)):
            if i < length:
                torch.testing.assert_close(got.scores[i][b], expected.scores[i][b], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(got.logits[i][b], expected.logits[i][b], rtol=1e-4, atol=1e-4)
            else:
                assert not bool(got.scores[i][b].any()) and not bool(got.logits[i][b].any())
    assert any(len((got.sequences[b, width:] == eos).nonzero()) for b in range(len(rows)))


def test_sampled_scores_are_generates_scores_for_the_drawn_prefix():
    inputs = FAMILY.cases["image"]
    prompt = inputs["input_ids"].shape[1]
    warp = dict(do_sample=True, temperature=1.3, top_k=10, top_p=0.9)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage").generate(
        **inputs,
        max_new_tokens=8,
        num_return_sequences=3,
        generator=torch.Generator().manual_seed(1),
        **warp,
        **OUTPUTS,
    )
    for row in range(3):
        drawn = tuple(got.sequences[row, prompt:].tolist())
        for i in (0, 3, 7):
            one = FAMILY.target.generate(**extend_inputs(inputs, drawn[:i]), max_new_tokens=1, **warp, **OUTPUTS)
            torch.testing.assert_close(got.scores[i][row], one.scores[0][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got.logits[i][row], one.logits[0][0], rtol=1e-4, atol=1e-4)


def test_stream_returns_each_prompts_scores():
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, **OUTPUTS)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    cases = ("text", "image", "video")
    for result in spec.stream(((c, FAMILY.cases[c]) for c in cases), batch_size=2, **kwargs):
        expected = FAMILY.target.generate(**FAMILY.cases[result.key], **kwargs)
        assert_steps_close(result.scores, expected.scores)
        assert_steps_close(result.logits, expected.logits)


def test_without_return_dict_in_generate_no_scores_are_kept():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    out = spec.generate(**FAMILY.cases["text"], do_sample=False, max_new_tokens=8, output_scores=True)
    assert isinstance(out, torch.Tensor)


@pytest.mark.parametrize("name", ["output_hidden_states", "output_attentions"])
def test_hidden_states_and_attentions_are_refused_naming_them(name):
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    with pytest.raises(UnsupportedGenerationError, match=f"{name}.*tree"):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, return_dict_in_generate=True, **{name: True})
