"""The default policy, `auto`: SAGE's trees for a sequence decoded alone, chains of a measured length for sequences
decoded together (no model: plans and made-up steps)."""

from __future__ import annotations

import pytest
import torch
from policy_steps import chain_step

from vlmspec import SpeculativeVLM
from vlmspec.policies import (
    SPECVLM_TREE,
    AdaptiveTreePlan,
    AutoPolicy,
    BatchShape,
    ChainLengthConfig,
    ChainPolicy,
    RankTreePlan,
    StepLesson,
)


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
    assert isinstance(plan, AdaptiveTreePlan) and policy.sage.confidence > 0.99
    assert plan.depth == policy.sage.depth_for(policy.sage.confidence)


def test_a_drafting_step_hands_back_the_alpha_sage_planned_it_with():
    policy = AutoPolicy()
    policy.plan()
    assert policy.observe(chain_step(torch.zeros(10).log_softmax(-1), accepted=1)) == StepLesson(alpha=0.5)


def test_a_row_that_rode_along_with_its_root_hands_back_its_planned_alpha_and_learns_nothing_of_it():
    """A row that drafted nothing while others did: its record keeps the alpha it last planned with, and SAGE does
    not take the step's root (it drafted no tree from it)."""
    policy = AutoPolicy()
    policy.plan()
    confident = torch.tensor([0.0] + [-30.0] * 9).log_softmax(-1)
    step = chain_step(confident, accepted=0)
    step.statistics, step.drafted = policy.statistics(confident).tolist(), False
    assert policy.observe(step) == StepLesson(alpha=0.5)
    assert policy.sage.alpha == 0.5


@pytest.mark.parametrize("rows", [1, 3])
def test_sequences_decoded_together_draft_chains_however_many_are_in_flight(rows):
    policy = AutoPolicy()
    plans = policy.plan_batch([policy.for_row() for _ in range(rows)])
    assert [p.paths for p in plans] == [ChainPolicy().plan().paths] * rows


def test_a_batchs_rows_learn_one_chain_length_and_its_step_time_once():
    policy = AutoPolicy(chain=ChainLengthConfig(warmup=(3, 6)))
    rows = [policy.for_row() for _ in range(3)]
    assert all(row.lengths is policy.lengths for row in rows)
    first = policy.plan_batch(rows)
    assert [p.paths for p in first] == [ChainPolicy(3).plan().paths] * 3
    log_probs = torch.zeros(10).log_softmax(-1)
    for b, row in enumerate(rows):
        step = chain_step(log_probs, accepted=2, probs=[0.9] * 3)
        step.batch = BatchShape(3, 12, 3, 9, 9, 100, 100, first=b == 0)
        row.observe(step)
    assert len(policy.lengths.times) == 1
    assert [p.paths for p in policy.plan_batch(rows)] == [ChainPolicy(6).plan().paths] * 3


def test_a_batch_that_samples_drafts_the_default_chain_whatever_the_clock_says():
    policy = AutoPolicy(chain=ChainLengthConfig(warmup=(2,)))
    rows = [policy.for_row() for _ in range(2)]
    plans = policy.plan_batch(rows, timed=False)
    assert [p.paths for p in plans] == [ChainPolicy().plan().paths] * 2
