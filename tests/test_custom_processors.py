"""A caller's `logits_processor` and `prefix_allowed_tokens_fn` shape every token as in the target's own `generate`:
applied at every node of every draft tree to that node's own sequence, for the target's choice and the draft's
proposals, greedy (equal ids) and sampled (the same distribution); every row of a batch with its own batch index."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import FAMILIES
from test_batch import padded_batch
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TypicalLogitsWarper

from vlmspec import SpeculativeVLM, UnsupportedGenerationError
from vlmspec.testing.distribution import continuations, eos_ids, exact_continuations, g_test

FAMILY = FAMILIES["qwen2_5_vl"]
NEW_TOKENS = 20


class AlternatingParity(LogitsProcessor):
    """After an odd token only even ones: a pure function of each row's last token, as a grammar constraint is."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        odd_last = input_ids[:, -1:] % 2 == 1
        odd_ids = torch.arange(scores.shape[-1], device=scores.device)[None] % 2 == 1
        return scores.masked_fill(odd_last & odd_ids, -torch.inf)


class CountingCalls(LogitsProcessor):
    """Keeps state between calls: bans a token from its third call on (assumes one call per generated token)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return scores if self.calls < 3 else scores.index_fill(1, torch.tensor([0], device=scores.device), -torch.inf)


class FixedMask(LogitsProcessor):
    """Bans every odd id with a mask as wide as the target's vocabulary, as processors built from it do."""

    def __init__(self, width: int):
        self.mask = torch.zeros(width)
        self.mask[1::2] = -torch.inf

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.mask.to(scores.device)


def allowed_by_row(batch_id: int, input_ids: torch.Tensor) -> list[int]:
    """Row `batch_id` may follow a token only with ids of the same residue mod 3, shifted by the row's index."""
    residue = (int(input_ids[-1]) + batch_id) % 3
    return list(range(residue, 300, 3))


@pytest.mark.parametrize("policy", ["chain", "static-tree", "sage", "sage-gt"])
@pytest.mark.parametrize("case", ["image", "video"])
def test_a_custom_logits_processor_decodes_as_generate(policy, case):
    kwargs = dict(
        do_sample=False, max_new_tokens=NEW_TOKENS, logits_processor=LogitsProcessorList([AlternatingParity()])
    )
    expected = FAMILY.target.generate(**FAMILY.cases[case], **kwargs)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy)
    assert torch.equal(spec.generate(**FAMILY.cases[case], **kwargs), expected)


def test_a_warper_passed_as_a_processor_decides_greedy_tokens_as_in_generate():
    custom = LogitsProcessorList([TypicalLogitsWarper(0.2)])
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, logits_processor=custom)
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs)
    assert not torch.equal(expected, FAMILY.reference("image", NEW_TOKENS))
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage")
    assert torch.equal(spec.generate(**FAMILY.cases["image"], **kwargs), expected)


def test_a_processor_as_wide_as_the_targets_vocabulary_serves_a_draft_of_fewer_ids():
    width = FAMILY.target.get_output_embeddings().weight.shape[0]
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS, logits_processor=LogitsProcessorList([FixedMask(width)]))
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage", vocab_size=width - 20)
    assert torch.equal(spec.generate(**FAMILY.cases["image"], **kwargs), expected)


def test_the_draft_proposes_under_the_custom_processor_too():
    """A self-draft under the same processors is always accepted: the draft's proposals see the processor."""
    kwargs = dict(
        do_sample=False, max_new_tokens=NEW_TOKENS, logits_processor=LogitsProcessorList([AlternatingParity()])
    )
    expected = FAMILY.target.generate(**FAMILY.cases["image"], **kwargs)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.target, "sage", pruning=None)
    assert torch.equal(spec.generate(**FAMILY.cases["image"], **kwargs), expected)
    assert all(step.accepted == step.greedy_depth for step in spec.last_stats.steps)


@pytest.mark.parametrize("policy", ["auto", "sage"])
def test_prefix_allowed_tokens_fn_sees_each_rows_own_batch_index(policy):
    rows = ("text", "image", "video")
    batch = padded_batch(FAMILY, rows)
    width = batch["input_ids"].shape[1]
    kwargs = dict(do_sample=False, max_new_tokens=NEW_TOKENS)
    expected = FAMILY.target.generate(**batch, prefix_allowed_tokens_fn=allowed_by_row, **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], policy).generate(
        **batch, prefix_allowed_tokens_fn=allowed_by_row, **kwargs
    )
    assert torch.equal(got, expected)
    for b, case in enumerate(rows):
        alone = FAMILY.target.generate(
            **FAMILY.cases[case], prefix_allowed_tokens_fn=lambda _, ids, b=b: allowed_by_row(b, ids), **kwargs
        )
        assert torch.equal(got[b, width:], alone[0, -NEW_TOKENS:]), case


def test_prefix_allowed_tokens_fn_with_several_draws_gives_each_its_prompts_index():
    kwargs = dict(do_sample=True, top_k=1, max_new_tokens=12, num_return_sequences=3)
    expected = FAMILY.target.generate(**FAMILY.cases["image"], prefix_allowed_tokens_fn=allowed_by_row, **kwargs)
    got = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(
        **FAMILY.cases["image"], prefix_allowed_tokens_fn=allowed_by_row, **kwargs
    )
    assert torch.equal(got, expected)


def test_a_batch_under_a_custom_processor_equals_the_targets_batched_generate():
    batch = padded_batch(FAMILY, ("two_images", "text", "long_prompt"))
    kwargs = dict(
        do_sample=False, max_new_tokens=NEW_TOKENS, logits_processor=LogitsProcessorList([AlternatingParity()])
    )
    expected = FAMILY.target.generate(**batch, **kwargs)
    assert torch.equal(SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"]).generate(**batch, **kwargs), expected)


def test_sampling_under_custom_processors_draws_the_targets_distribution():
    warp = dict(temperature=1.5, top_k=6)
    custom = dict(logits_processor=LogitsProcessorList([AlternatingParity()]), prefix_allowed_tokens_fn=allowed_by_row)
    inputs = FAMILY.cases["image"]
    exact = exact_continuations(FAMILY.target, inputs, 4, 0.005, **warp, **custom)
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"], "sage")
    sequences = spec.generate(
        **inputs,
        do_sample=True,
        max_new_tokens=4,
        num_return_sequences=1000,
        generator=torch.Generator().manual_seed(0),
        **warp,
        **custom,
    )
    samples = continuations(sequences, inputs["input_ids"].shape[1], eos_ids(FAMILY.target, {}))
    result = g_test(samples, exact)
    assert result.passes(1e-3), result


def test_a_processor_that_keeps_state_between_calls_is_refused_naming_it():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    with pytest.raises(UnsupportedGenerationError, match="CountingCalls.*calls"):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, logits_processor=LogitsProcessorList([CountingCalls()]))


def test_something_that_is_not_a_processor_is_refused():
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts["noisy"])
    with pytest.raises(TypeError, match="not a logits processor"):
        spec.generate(**FAMILY.cases["text"], max_new_tokens=4, logits_processor=LogitsProcessorList([3]))


def readme_example(marker: str) -> str:
    """The Python example in docs/generate-contract.md (moved there from the README) that contains `marker`."""
    text = (Path(__file__).parents[1] / "docs" / "generate-contract.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_the_readmes_json_constraint_answers_as_the_targets_generate_does(capsys):
    example: dict = {}
    exec(readme_example("class OneOf"), example)
    spec, inputs, prompt = example["spec"], example["inputs"], example["prompt"]
    text = spec.processor.tokenizer.decode(example["ids"][0, prompt:], skip_special_tokens=True)
    assert text in example["answers"]
    assert str(json.loads(text)) in capsys.readouterr().out
    expected = spec.target.generate(**inputs, logits_processor=example["constrained"], max_new_tokens=32)
    assert torch.equal(example["ids"], expected)
