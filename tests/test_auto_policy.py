"""The default policy, `auto`: SAGE's trees for a sequence decoded alone, chains for sequences decoded together
(no model: plans and made-up steps)."""

from __future__ import annotations

import pytest
import torch
from policy_steps import chain_step

from vlmspec import SpeculativeVLM
from vlmspec.policies import SPECVLM_TREE, AdaptiveTreePlan, AutoPolicy, ChainPolicy, RankTreePlan


def test_no_policy_given_means_auto(target):
    assert SpeculativeVLM(target, target).policy.name == "auto"


def test_a_sequence_decoded_alone_starts_from_sages_first_tree_and_adapts():
    policy = AutoPolicy()
    assert policy.plan().paths == RankTreePlan(SPECVLM_TREE).paths
    confident = torch.tensor([0.0] + [-30.0] * 9).log_softmax(-1)
    step = chain_step(confident, accepted=4)
    step.statistics = policy.statistics(confident).tolist()
    policy.observe(step)
    plan = policy.plan()
    assert isinstance(plan, AdaptiveTreePlan) and policy.confidence > 0.99
    assert plan.depth == policy.sage.depth_for(policy.confidence)


@pytest.mark.parametrize("rows", [1, 3])
def test_sequences_decoded_together_draft_chains_however_many_are_in_flight(rows):
    policy = AutoPolicy()
    plans = policy.plan_batch([policy.for_row() for _ in range(rows)])
    assert [p.paths for p in plans] == [ChainPolicy().plan().paths] * rows
