"""Speculative output equals the target's own greedy `generate`, token for token, for every family, policy and draft."""

from __future__ import annotations

import pytest
import torch
from conftest import CASES, DRAFTS

from vlmspec import SpeculativeVLM

POLICIES = ("chain", "static-tree", "sage")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("draft_name", DRAFTS)
@pytest.mark.parametrize("case", CASES)
def test_greedy_output_equals_target_generate(family, case, draft_name, policy):
    spec = SpeculativeVLM(family.target, family.drafts[draft_name], policy=policy, pruning=None)
    out = spec.generate(**family.cases[case], max_new_tokens=32)
    assert torch.equal(out, family.reference(case))
    stats = spec.last_stats
    assert stats.new_tokens == out.shape[1] - family.cases[case]["input_ids"].shape[1]
    if draft_name == "self":
        assert all(step.accepted == step.greedy_depth for step in stats.steps)
        assert all(step.greedy_depth == step.tree_depth for step in stats.steps if policy != "sage")


@pytest.mark.parametrize("pruning", ["verifier", "uniform", "random"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", ["image", "two_images", "video"])
def test_pruning_the_draft_never_changes_the_output(family, case, policy, pruning):
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy, pruning=pruning)
    out = spec.generate(**family.cases[case], max_new_tokens=32)
    assert torch.equal(out, family.reference(case))
    assert spec.last_stats.draft_prefill_tokens < spec.last_stats.target_prefill_tokens


def test_self_draft_accepts_every_planned_token_of_a_chain(target, cases):
    spec = SpeculativeVLM(target, target, policy="chain", pruning=None)
    spec.generate(**cases["image"], max_new_tokens=31)
    assert [s.accepted for s in spec.last_stats.steps] == [5] * 5
    assert spec.last_stats.mean_accept_length == 5.0


def test_noisy_draft_is_accepted_only_partially(target, drafts, cases):
    spec = SpeculativeVLM(target, drafts["noisy"], policy="static-tree")
    spec.generate(**cases["image"], max_new_tokens=32)
    accepted = [s.accepted for s in spec.last_stats.steps]
    assert 0 < sum(accepted) < 5 * len(accepted)
