"""The SAGE policy: confidence, adaptive depth and width, width decay, thresholds, node cap, history."""

from __future__ import annotations

import math

import pytest
import torch
from policy_steps import chain_step

from vlmspec import SageConfig, SagePolicy
from vlmspec.policies import AdaptiveTreePlan, LevelRules, RankTreePlan, StepLesson
from vlmspec.policies.sage import confidence


def test_confidence_is_one_for_a_one_hot_distribution():
    log_probs = torch.full((50,), -1e9)
    log_probs[3] = 0.0
    assert confidence(log_probs, 10) == pytest.approx(1.0)


def test_confidence_is_zero_for_a_uniform_distribution():
    assert confidence(torch.full((50,), -math.log(50)), 10) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("alpha", "depth", "width"), [(0.0, 3, 10.0), (0.5, 6, 6.0), (1.0, 8, 2.0)])
def test_depth_and_width_follow_confidence(alpha, depth, width):
    policy = SagePolicy()
    assert policy.depth_for(alpha) == depth
    assert policy.width_for(alpha) == pytest.approx(width)


def test_first_step_uses_the_static_tree_then_adapts():
    policy = SagePolicy()
    assert isinstance(policy.plan(), RankTreePlan)
    one_hot = torch.full((50,), -1e9)
    one_hot[0] = 0.0
    policy.observe(chain_step(one_hot, accepted=3))
    plan = policy.plan()
    assert isinstance(plan, AdaptiveTreePlan)
    assert (plan.depth, plan.width) == (8, pytest.approx(2.0))


def test_observe_hands_back_the_alpha_the_steps_tree_was_planned_with_not_the_one_it_measured():
    """The step's record keeps the alpha that shaped its tree (the initial 0.5 here); the confident root it measured
    shapes the next tree."""
    policy = SagePolicy()
    policy.plan()
    one_hot = torch.full((50,), -1e9)
    one_hot[0] = 0.0
    assert policy.observe(chain_step(one_hot, accepted=3)) == StepLesson(alpha=0.5)
    policy.plan()
    assert policy.observe(chain_step(one_hot, accepted=3)).alpha == pytest.approx(1.0)


def _kept(plan, level, parents, children, left=None) -> list[list[bool]]:
    """Which children the plan's level rule keeps at `level` for one row: frontier log-probabilities `parents` (F,),
    the children's top-k log-probabilities `children` (F, k); `left` nodes left under the cap (None: unbound)."""
    rules = LevelRules.of([plan], [plan.depth], torch.device("cpu"))
    budget = None if left is None else torch.tensor([left])
    choice = rules.select(level, parents[None], None, children[None], budget)
    return (~choice.drop[0]).tolist()


def test_width_decays_with_depth_and_grows_with_parent_probability():
    plan = AdaptiveTreePlan(depth=5, width=8.0, max_nodes=64, top_k=10, threshold_scale=1e-9)
    children = torch.full((1, 10), math.log(0.1))
    assert sum(_kept(plan, 1, torch.log(torch.tensor([0.3])), children)[0]) == 8
    widths = [sum(row) for row in _kept(plan, 2, torch.log(torch.tensor([0.5, 0.1])), children.expand(2, -1))]
    assert widths == [4, 3]  # ranks below 8 / 2 * 1.0 and 8 / 2 * 0.6
    assert sum(_kept(plan, 4, torch.log(torch.tensor([0.5])), children)[0]) == 2  # below 8 / 4 * 1.0


def test_children_below_the_depth_threshold_are_not_expanded():
    plan = AdaptiveTreePlan(depth=4, width=10.0, max_nodes=64, top_k=4, threshold_scale=0.1)
    assert plan.threshold(2) == pytest.approx(0.05)
    parent = torch.log(torch.tensor([0.5]))
    children = torch.log(torch.tensor([[0.5, 0.2, 0.09, 0.05]]))
    assert _kept(plan, 2, parent, children) == [[True, True, False, False]]


def test_rank_must_be_below_the_local_width():
    plan = AdaptiveTreePlan(depth=3, width=2.0, max_nodes=64, top_k=4, threshold_scale=0.0001)
    children = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    assert _kept(plan, 1, torch.zeros(1), children) == [[True, True, False, False]]


def test_node_cap_keeps_the_most_probable_children():
    plan = AdaptiveTreePlan(depth=3, width=10.0, max_nodes=64, top_k=4, threshold_scale=0.0001)
    parents = torch.log(torch.tensor([0.6, 0.3]))
    children = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.9, 0.05, 0.03, 0.02]]))
    keep = _kept(plan, 2, parents, children, left=3)
    assert keep == [[True, True, False, False], [True, False, False, False]]


def test_rows_of_different_plans_keep_what_each_keeps_alone():
    """One level over a batch mixing a fixed tree, SAGE's rule and another top-k: each row's drops are its own."""
    cpu = torch.device("cpu")
    plans = [
        RankTreePlan([[0], [2], [0, 1]]),
        AdaptiveTreePlan(depth=3, width=2.0, max_nodes=64, top_k=4, threshold_scale=0.0001),
        AdaptiveTreePlan(depth=3, width=10.0, max_nodes=64, top_k=6, threshold_scale=0.0001),
    ]
    children = torch.log(torch.tensor([[0.3, 0.2, 0.15, 0.1, 0.1, 0.05]]))
    together = LevelRules.of(plans, [3, 3, 3], cpu).select(1, torch.zeros(3, 1), None, children.expand(3, 1, -1))
    for b, plan in enumerate(plans):
        alone = LevelRules.of([plan], [3], cpu).select(1, torch.zeros(1, 1), None, children[None, :, : plan.top_k])
        assert (~together.drop[b, :, : plan.top_k]).tolist() == (~alone.drop[0]).tolist()
        assert not (~together.drop[b, :, plan.top_k :]).any()
    assert (~together.drop[0]).tolist() == [[True, False, True, False, False, False]]


def test_a_fixed_trees_children_stay_under_a_binding_cap_where_the_warpers_cut_them():
    plans = [
        RankTreePlan([[0], [1], [2]]),
        AdaptiveTreePlan(depth=3, width=10.0, max_nodes=2, top_k=3, threshold_scale=0.0001),
    ]
    rules = LevelRules.of(plans, [3, 3], torch.device("cpu"))
    children = torch.tensor([[[-0.1, -math.inf, -math.inf]], [[-0.5, -1.0, -2.0]]])
    choice = rules.select(1, torch.zeros(2, 1), None, children, left=rules.caps)
    assert (~choice.drop).tolist() == [[[True, True, True]], [[True, True, False]]]


def test_sage_trees_never_exceed_the_node_cap(target, cases):
    from vlmspec import SpeculativeVLM

    spec = SpeculativeVLM(target, target, policy=SageConfig(max_nodes=7))
    spec.generate(**cases["text"], max_new_tokens=24)
    assert all(step.nodes <= 7 for step in spec.last_stats.steps[1:])


def test_history_lowers_the_maximum_depth_after_a_window_of_short_acceptances():
    policy = SagePolicy(SageConfig(history_window=4))
    for _ in range(3):
        policy.record_acceptance(1)
    assert policy.depth_max == 8
    policy.record_acceptance(1)
    assert policy.depth_max == 7
    assert len(policy.history) == 0


def test_history_raises_the_maximum_depth_after_a_window_of_long_acceptances():
    policy = SagePolicy(SageConfig(history_window=3))
    for _ in range(3):
        policy.record_acceptance(5)
    assert policy.depth_max == 9
    assert policy.depth_for(1.0) == 9


def test_history_between_the_thresholds_changes_nothing():
    policy = SagePolicy(SageConfig(history_window=3))
    for accepted in (2, 3, 2, 3, 2):
        policy.record_acceptance(accepted)
    assert policy.depth_max == 8


def test_history_respects_its_bounds():
    policy = SagePolicy(SageConfig(history_window=1, depth_max_ceiling=9))
    for _ in range(5):
        policy.record_acceptance(8)
    assert policy.depth_max == 9
    for _ in range(20):
        policy.record_acceptance(0)
    assert policy.depth_max == 3


def test_reset_forgets_history_and_confidence():
    policy = SagePolicy(SageConfig(history_window=1))
    policy.observe(chain_step(torch.zeros(20), accepted=9))
    policy.reset()
    assert (policy.alpha, policy.depth_max, len(policy.history)) == (0.5, 8, 0)


def test_invalid_config_is_refused():
    with pytest.raises(ValueError, match="depth_min"):
        SageConfig(depth_min=9, depth_max=8)
