"""Relaxed (lossy) verification, CM-ASD's confidence-modulated rule: its margins and acceptance on made-up trees,
then decoding under it. With zero margins it is the target's own `generate`; with wider ones every emitted token the
target would not have chosen is counted, as a teacher-forced pass of the target over the output finds them; exact rows
beside relaxed ones keep their own `generate`'s ids; a sampled config is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import device_map, on_device
from one_tree import made_tree
from transformers import StoppingCriteria, StoppingCriteriaList

from vlmspec import InvalidArgumentError, RelaxedVerification, SpeculativeVLM
from vlmspec.api import load_pair
from vlmspec.engine.acceptance import pack_rows, read_rows
from vlmspec.engine.relaxed import RelaxedRows, accept_relaxed_rows, margins, resolve_verification
from vlmspec.engine.tree import Trees
from vlmspec.testing import REPLICA_PAIRS, chat_inputs, sample_image

ZERO = RelaxedVerification(tau_base=0.0, gamma=0.0, top_beta=1)
WIDE = RelaxedVerification(tau_base=2.0, gamma=2.0, top_beta=5)


def rules(*rows: RelaxedVerification | None) -> RelaxedRows:
    return RelaxedRows.of(list(rows), torch.device("cpu"))


def chain(tokens: list[int], confidence: list[float]) -> Trees:
    """A chain of `tokens` below root token 9, each node's draft confidence given (the last one's unused)."""
    tree = made_tree(9, list(range(len(tokens))), tokens).rows()
    return dataclasses.replace(tree, confidence=torch.tensor([confidence]))


def scores_after(*rows: list[float]) -> torch.Tensor:
    """The target's scores (1, N, V) after each node, one list per node."""
    return torch.tensor([rows])


def test_the_margin_is_the_seeds_formula_and_the_prose_reverses_its_confidence():
    confidence = torch.tensor([[0.0, 0.5, 1.0]])
    formula = RelaxedVerification(tau_base=0.1, gamma=2.0, direction="formula")
    prose = RelaxedVerification(tau_base=0.1, gamma=2.0, direction="prose")
    assert torch.allclose(margins(confidence, rules(formula)), torch.tensor([[2.1, 1.1, 0.1]]))
    assert torch.allclose(margins(confidence, rules(prose)), torch.tensor([[0.1, 1.1, 2.1]]))


def test_a_second_choice_within_the_margin_is_accepted_and_marked_as_differing():
    trees = chain([1, 2], [1.0, 1.0, 1.0])
    # After the root the target prefers 0 (score 3.0) to the drafted 1 (2.5): a gap of 0.5 nats. After node 1 it
    # chooses the drafted 2 itself; after node 2 it chooses 4.
    scores = scores_after([3.0, 2.5, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 3.0])
    verdict = accept_relaxed_rows(trees, scores, rules(RelaxedVerification(tau_base=0.6, gamma=0.0)))
    assert verdict.accepted.tolist() == [2] and verdict.bonus.tolist() == [4]
    assert verdict.differs.tolist() == [[True, False, False]]


def test_a_gap_beyond_the_margin_is_rejected_and_the_target_chooses():
    trees = chain([1, 2], [1.0, 1.0, 1.0])
    scores = scores_after([3.0, 2.5, 0.0, 0.0, 0.0], [0.0, 0.0, 3.0, 0.0, 0.0], [0.0] * 5)
    verdict = accept_relaxed_rows(trees, scores, rules(RelaxedVerification(tau_base=0.4, gamma=0.0)))
    assert verdict.accepted.tolist() == [0] and verdict.bonus.tolist() == [0]
    assert verdict.differs.tolist() == [[False, False, False]]


def test_a_token_outside_the_top_beta_is_rejected_however_small_its_gap():
    trees = chain([3], [1.0, 1.0])
    near = scores_after([3.0, 2.9, 2.8, 2.7, 0.0], [0.0] * 5)  # the drafted 3 is the 4th best, 0.3 nats below
    assert accept_relaxed_rows(trees, near, rules(RelaxedVerification(1.0, 0.0, top_beta=3))).accepted.tolist() == [0]
    assert accept_relaxed_rows(trees, near, rules(RelaxedVerification(1.0, 0.0, top_beta=4))).accepted.tolist() == [1]


def test_the_drafts_confidence_at_the_parent_moves_the_margin():
    scores = scores_after([3.0, 2.0, 0.0, 0.0, 0.0], [0.0] * 5)  # the drafted 1 is 1 nat below the top
    rule = RelaxedVerification(tau_base=0.1, gamma=2.0)
    unsure, sure = chain([1], [0.2, 0.0]), chain([1], [0.9, 0.0])
    # tau = 0.1 + 2 (1 - C): 1.7 where the draft was unsure, 0.3 where it was sure.
    assert accept_relaxed_rows(unsure, scores, rules(rule)).accepted.tolist() == [1]
    assert accept_relaxed_rows(sure, scores, rules(rule)).accepted.tolist() == [0]
    prose = dataclasses.replace(rule, direction="prose")
    assert accept_relaxed_rows(unsure, scores, rules(prose)).accepted.tolist() == [0]
    assert accept_relaxed_rows(sure, scores, rules(prose)).accepted.tolist() == [1]


def test_an_exact_row_beside_a_relaxed_one_takes_the_targets_choices_alone():
    one = chain([1], [1.0, 1.0])
    trees = dataclasses.replace(
        one,
        tokens=one.tokens.repeat(2, 1),
        log_probs=one.log_probs.repeat(2, 1),
        confidence=one.confidence.repeat(2, 1),
    )
    scores = scores_after([3.0, 2.5, 0.0, 0.0, 0.0], [0.0] * 5).repeat(2, 1, 1)
    verdict = accept_relaxed_rows(trees, scores, rules(None, WIDE))
    assert verdict.accepted.tolist() == [0, 1] and verdict.bonus.tolist() == [0, 0]


def test_the_differing_count_read_with_the_step_stops_at_the_first_eos():
    trees = chain([1, 2, 3], [1.0] * 4)
    # Every drafted token is the target's second choice, 0.5 nats down; 2 is EOS.
    scores = scores_after(*[[3.0 if v == 0 else 2.5 if v == t else 0.0 for v in range(5)] for t in (1, 2, 3, 0)])
    verdict = accept_relaxed_rows(trees, scores, rules(RelaxedVerification(tau_base=1.0, gamma=0.0)))
    tokens = torch.tensor([[1, 2, 3, 0]])
    packed = pack_rows(trees, verdict, tokens, torch.tensor([[2]]), [10], torch.zeros(1, dtype=torch.long))
    (report,) = read_rows(packed, trees, tokens, False, differing=True)
    assert report.accepted == 3 and report.count == 2 and report.differing == 2


def test_settings_outside_their_ranges_are_refused_by_name():
    bad_settings = [({"tau_base": -0.1}, "tau_base"), ({"gamma": -1.0}, "gamma"), ({"top_beta": 0}, "top_beta")]
    for bad, name in [*bad_settings, ({"top_beta": 10**30}, "top_beta"), ({"top_beta": 65}, "top_beta")]:
        with pytest.raises(ValueError, match=name):
            RelaxedVerification(**bad)
    with pytest.raises(ValueError, match="direction"):
        RelaxedVerification(direction="sideways")
    with pytest.raises(ValueError, match="verification"):
        resolve_verification("approximate")


def teacher_forced_differences(target, inputs: dict, out: torch.Tensor) -> int:
    """How many new tokens of `out` (1, L + n) the target would not have chosen after the tokens before them."""
    length, extra = inputs["input_ids"].shape[1], out.shape[1] - inputs["input_ids"].shape[1]
    full = {**inputs, "input_ids": out, "attention_mask": torch.ones_like(out)}
    if "mm_token_type_ids" in full:
        types = full["mm_token_type_ids"]
        full["mm_token_type_ids"] = torch.cat([types, types.new_zeros(1, extra)], dim=1)
    with torch.no_grad():
        logits = target(**full).logits
    return int((logits[0, length - 1 : -1].argmax(-1) != out[0, length:]).sum())


@pytest.mark.parametrize("policy", ["chain", "static-tree", "sage", "confidence"])
def test_zero_margins_decode_the_targets_own_generate(family, policy):
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy, verification=ZERO)
    out = spec.generate(**family.cases["image"], max_new_tokens=32)
    assert torch.equal(out, family.reference("image"))
    assert spec.last_stats.verification.startswith("relaxed") and spec.last_stats.differing_tokens == 0


@pytest.mark.parametrize("policy", ["chain", "sage"])
def test_every_token_the_target_would_not_choose_is_counted(qwen, policy):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy=policy, verification=WIDE)
    exact = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy=policy)
    exact.generate(**qwen.cases["image"], max_new_tokens=32)
    out = spec.generate(**qwen.cases["image"], max_new_tokens=32)
    differing = spec.last_stats.differing_tokens
    assert differing > 0 and not torch.equal(out, qwen.reference("image"))
    assert differing == teacher_forced_differences(qwen.target, qwen.cases["image"], out)
    assert spec.last_stats.mean_accept_length > exact.last_stats.mean_accept_length


def test_a_call_may_ask_for_exact_verification_of_a_relaxed_pair(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="sage", verification=WIDE)
    out = spec.generate(**qwen.cases["image"], max_new_tokens=32, verification="exact")
    assert torch.equal(out, qwen.reference("image")) and spec.last_stats.verification == "exact"


def test_exact_rows_stream_beside_relaxed_ones_and_keep_their_own_ids(qwen):
    cases = ("two_images", "video", "text")
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="chain")
    prompts = [(i, qwen.cases[case], {"verification": WIDE if i % 2 else "exact"}) for i, case in enumerate(cases)]
    results = {r.key: r for r in spec.stream(prompts, batch_size=3, max_new_tokens=24)}
    for i, case in enumerate(cases):
        if i % 2 == 0:
            assert torch.equal(results[i].sequence, qwen.reference(case, 24)), case
            assert results[i].stats.verification == "exact"
        else:
            assert results[i].stats.verification.startswith("relaxed")


def test_relaxed_verification_of_a_sampled_config_is_refused_by_name(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], verification="relaxed")
    with pytest.raises(InvalidArgumentError, match="verification='relaxed'.*do_sample=True"):
        spec.generate(**qwen.cases["image"], max_new_tokens=8, do_sample=True)


@pytest.mark.parametrize("name", list(REPLICA_PAIRS))
def test_zero_margins_on_the_released_replicas_decode_their_greedy_generate(replica_pairs, name):
    spec = load_pair(*replica_pairs[name], device_map=device_map())
    inputs = on_device(chat_inputs(spec.processor, "Describe the image in detail.", images=[sample_image(5, (48, 64))]))
    expected = spec.target.generate(**inputs, max_new_tokens=12, do_sample=False)
    out = spec.with_options("sage", verification=ZERO).generate(**inputs, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, expected)


def test_a_relaxed_pairs_warm_up_compiles_what_its_decoding_meets(qwen):
    from torch._dynamo.utils import counters

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], "chain", pruning=None, compile="on", verification=WIDE)
    spec.warm_up(16, **qwen.cases["long_prompt"])
    before = counters["stats"]["unique_graphs"]
    for case in ("image", "video"):
        spec.generate(**qwen.cases[case], max_new_tokens=16)
        assert spec.last_stats.verification == WIDE.label
    assert counters["stats"]["unique_graphs"] == before


class StopAfter(StoppingCriteria):
    """A Python criterion: stop once `length` tokens are in the sequence (judged on the host, after the step)."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


def test_a_python_criterion_that_cuts_a_step_counts_only_the_tokens_kept(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="chain", verification=WIDE)
    inputs = qwen.cases["image"]
    for kept in (5, 9, 14):
        criteria = StoppingCriteriaList([StopAfter(inputs["input_ids"].shape[1] + kept)])
        out = spec.generate(**inputs, max_new_tokens=32, stopping_criteria=criteria)
        assert out.shape[1] == inputs["input_ids"].shape[1] + kept
        assert spec.last_stats.differing_tokens == teacher_forced_differences(qwen.target, inputs, out)
