"""A draft head drafts losslessly: with a random head every family's output equals the target's own `generate` under
every policy, on an image and a video, one sequence or a padded batch, pruned or not; a head built to compute the
target's next token has its first draft token accepted at every step; sampled draws follow the target's exact
distribution."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, on_device
from sampling_cases import ALPHA, SAMPLES, speculative_test

from vlmspec import SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.testing.heads import copying_pair, random_head

POLICIES = ("chain", "static-tree", "sage", "sage-gt", "heterospec", "confidence", "auto")
#: The tiny targets have two layers: the heads read the states entering layers 1, 1 and 2 (named 0, 0, 1).
LAYERS = [0, 0, 1]


def heterospec_or(policy: str):
    """`policy`, with bins made up for heterospec (the tests' heads ship none)."""
    if policy != "heterospec":
        return policy
    from vlmspec import HeteroSpecConfig, PathEntropyBins

    return HeteroSpecConfig(bins=PathEntropyBins([0.1, 0.5, 1.0]))


@pytest.fixture(scope="module")
def heads():
    return {
        name: random_head(family.target, seed=1, layer_ids=LAYERS, draft_vocab=300) for name, family in FAMILIES.items()
    }


@pytest.mark.parametrize("case", ["image", "video"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_random_head_decodes_the_targets_own_greedy_output(family, heads, policy, case):
    spec = SpeculativeVLM(family.target, heads[family.name], heterospec_or(policy))
    out = spec.generate(**family.cases[case], do_sample=False, max_new_tokens=24)
    assert torch.equal(out, family.reference(case, 24))


@pytest.mark.parametrize("pruning", ["verifier", None])
def test_a_head_drafts_on_the_kept_visual_positions_or_all_of_them(family, heads, pruning):
    spec = SpeculativeVLM(family.target, heads[family.name], "sage", pruning=pruning)
    out = spec.generate(**family.cases["video"], do_sample=False, max_new_tokens=24)
    assert torch.equal(out, family.reference("video", 24))
    entries = family.cases["video"]["input_ids"].shape[1] - 1
    if pruning is None:
        assert spec.last_stats.draft_prefill_tokens == entries
    else:
        assert spec.last_stats.draft_prefill_tokens < entries


def test_a_heads_default_feeds_every_position_as_a_released_head_was_trained(qwen, heads):
    spec = SpeculativeVLM(qwen.target, heads[qwen.name], "sage")
    out = spec.generate(**qwen.cases["video"], do_sample=False, max_new_tokens=24)
    assert torch.equal(out, qwen.reference("video", 24)) and spec.pruning is None
    assert spec.last_stats.draft_prefill_tokens == qwen.cases["video"]["input_ids"].shape[1] - 1


@pytest.mark.parametrize("policy", ["auto", "sage"])
def test_every_row_of_a_padded_batch_equals_its_own_generate(family, heads, policy):
    cases = ("text", "image", "video", "long_prompt")
    batch = on_device(adapter_for(family.target).join_rows([family.cpu_cases[c] for c in cases], 0))
    spec = SpeculativeVLM(family.target, heads[family.name], policy)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=16)
    width = batch["input_ids"].shape[1]
    for b, case in enumerate(cases):
        alone = family.reference(case, 16)[0]
        prompt = family.cases[case]["input_ids"].shape[1]
        assert torch.equal(out[b, width - prompt :][: alone.shape[0]], alone), case


def test_a_stream_keeps_a_batch_full_and_every_prompt_decodes_as_alone(heads):
    family = FAMILIES["qwen2_5_vl"]
    cases = ["image", "video", "text", "two_images", "long_prompt"]
    spec = SpeculativeVLM(family.target, heads[family.name])
    results = spec.stream(
        ((case, family.cases[case]) for case in cases), batch_size=2, do_sample=False, max_new_tokens=16
    )
    for result in results:
        assert result.error is None
        assert torch.equal(result.sequence, family.reference(result.key, 16)), result.key


@pytest.mark.parametrize("policy", ["chain", "sage"])
def test_a_head_computing_the_targets_next_token_has_its_first_draft_accepted_at_every_step(family, policy):
    """The copying head (`copying_pair`) pins the conventions: each token beside the feature before it, at that
    feature's position, its embedding the first half of what attention reads, draft ids mapped to the target's."""
    target, head = copying_pair(family.target)
    spec = SpeculativeVLM(target, head, policy)
    for case in ("image", "video"):
        out = spec.generate(**family.cases[case], do_sample=False, max_new_tokens=24)
        assert torch.equal(out, target.generate(**family.cases[case], do_sample=False, max_new_tokens=24))
        drafted = [step.accepted for step in spec.last_stats.steps if step.nodes > 0]
        assert drafted and min(drafted) >= 1


def test_sampled_draws_with_a_head_follow_the_targets_exact_distribution(heads):
    result, _ = speculative_test("sage", heads["qwen2_5_vl"], "image", "top_k_top_p")
    assert result.samples == SAMPLES and result.impossible == 0
    assert result.passes(ALPHA), result


def next_turn(family, sequences: torch.Tensor) -> dict:
    """The conversation after the image case's first turn: its ids so far and a new message (no visual inputs: the
    cached turn holds the image), as `generate` goes on from a cache."""
    new = family.processor.tokenizer(" And then?", return_tensors="pt").input_ids.to(sequences.device)
    ids = torch.cat([sequences, new], 1)
    turn = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    types = family.cases["image"].get("mm_token_type_ids")
    if types is not None:
        turn["mm_token_type_ids"] = torch.cat([types, types.new_zeros(1, ids.shape[1] - types.shape[1])], 1)
    return turn


@pytest.mark.parametrize("returned_by", ["vlmspec", "generate"])
@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "llava_onevision"])
def test_a_conversations_next_turn_with_a_head_goes_on_from_the_returned_cache_as_generate(name, returned_by):
    """From a cache vlmspec returned (the head keeps its own entries) or one `generate` returned (the head starts at
    the new turn, the only tokens the target runs): `generate`'s own continuation, only the new turn prefilled, and
    the copying head's first draft accepted at every step."""
    family = FAMILIES[name]
    target, head = copying_pair(family.target)
    spec = SpeculativeVLM(target, head, "sage")
    kwargs = dict(do_sample=False, max_new_tokens=8, return_dict_in_generate=True)
    theirs = target.generate(**family.cases["image"], **kwargs)
    first = (spec if returned_by == "vlmspec" else target).generate(**family.cases["image"], **kwargs)
    turn = next_turn(family, theirs.sequences)
    expected = target.generate(**turn, cache=theirs.cache, do_sample=False, max_new_tokens=12)
    got = spec.generate(**turn, cache=first.cache, do_sample=False, max_new_tokens=12)
    assert torch.equal(got, expected)
    assert spec.last_stats.target_prefill_tokens == turn["input_ids"].shape[1] - theirs.sequences.shape[1] + 1
    drafted = [step.accepted for step in spec.last_stats.steps if step.nodes > 0]
    assert drafted and min(drafted) >= 1
