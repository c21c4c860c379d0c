"""The cost-aware policy: its cost model, its acceptance calibration, its plans, and what it keeps across calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from policy_steps import chain_step

from vlmspec.policies import BatchShape, CostAwareTreePlan, LevelRules, RankTreePlan, SageGtConfig, SageGtPolicy
from vlmspec.policies.calibration import AcceptanceCalibration
from vlmspec.policies.cost_model import CostModel, StepCost, WindowedLeastSquares


def _step(nodes: int, context: int, forwards: int, verify: float, draft: float) -> StepCost:
    return StepCost(nodes + 1, context, forwards, nodes + 1, context, verify, draft)


def test_cost_model_recovers_verification_and_drafting_costs_from_steps():
    rng = np.random.default_rng(0)
    model = CostModel(window=200)
    for _ in range(200):
        nodes, context, forwards = int(rng.integers(1, 64)), int(rng.integers(100, 3000)), int(rng.integers(1, 12))
        verify = 0.015 + 0.0003 * (nodes + 1) + 0.0002 * (nodes + 1) * context / 1000
        draft = 0.002 * forwards + 0.00005 * (nodes + 1)
        model.add(_step(nodes, context, forwards, verify * rng.normal(1, 0.01), draft * rng.normal(1, 0.01)))
    assert model.predict(_step(30, 2000, 6, 0.0, 0.0)) == pytest.approx(
        0.015 + 0.0093 + 0.0124 + 0.012 + 0.00155, rel=0.03
    )
    assert model.node_seconds(2000, 2000) == pytest.approx(0.0003 + 0.0004 + 0.00005, rel=0.1)
    fixed, per_node = model.forward_seconds(2000)
    assert fixed == pytest.approx(0.002, rel=0.05)
    assert per_node == pytest.approx(0.00005, rel=0.3)


def test_least_squares_follows_the_last_window_only():
    fit = WindowedLeastSquares(2, window=20, ridge=1e-6)
    for n in range(40):
        fit.add([1.0, n % 7], 1.0 + 2.0 * (n % 7))
    for n in range(20):
        fit.add([1.0, n % 7], 5.0 + 0.5 * (n % 7))
    assert fit.weights == pytest.approx([5.0, 0.5], rel=1e-3)


def test_costs_never_come_out_negative():
    model = CostModel()
    for nodes in range(10):
        model.add(_step(nodes, 100, 3, 0.02 - 0.001 * nodes, 0.01 - 0.0005 * nodes))
    assert model.node_seconds(100, 100) == 0.0
    assert model.forward_seconds(100)[1] == 0.0


def test_calibration_starts_calibrated_and_learns_an_underconfident_draft():
    calibration = AcceptanceCalibration(bins=10, prior=4.0, memory=1000)
    assert float(calibration.rate(torch.tensor(0.55).log())) == pytest.approx(0.55)
    assert float(calibration.rate(torch.tensor(0.0).log())) == 0.0
    for _ in range(50):
        step = chain_step(torch.zeros(5), accepted=3, probs=[0.55, 0.55, 0.55])
        calibration.observe(step.tree.parents, step.tree.log_probs, step.path)
    assert float(calibration.rate(torch.tensor(0.55).log())) > 0.95
    assert calibration.continuation > 0.7


def test_calibration_counts_only_children_whose_parent_was_accepted():
    calibration = AcceptanceCalibration(bins=10, prior=1.0, memory=1e9)
    step = chain_step(torch.zeros(5), accepted=1, probs=[0.95, 0.95, 0.95])
    calibration.observe(step.tree.parents, step.tree.log_probs, step.path)
    assert sum(calibration.tested) == pytest.approx(10 + 2)
    assert calibration.accepted[-1] == pytest.approx(0.95 + 1)


def test_expected_accepted_length_multiplies_rates_along_each_path():
    calibration = AcceptanceCalibration(bins=10)
    step = chain_step(torch.zeros(5), accepted=0, probs=[0.55, 0.35])
    expected = calibration.expected_accepted(step.tree.parents, step.tree.log_probs)
    assert expected == pytest.approx(0.55 + 0.55 * 0.35)


def _plan(
    node_floor: float, forward_floor: tuple[float, float] = (0.0, 0.0), explore: bool = False
) -> CostAwareTreePlan:
    return CostAwareTreePlan(
        width=3.0,
        max_depth=16,
        max_nodes=64,
        top_k=4,
        calibration=AcceptanceCalibration(bins=20),
        node_floor=node_floor,
        forward_floor=forward_floor,
        explore=explore,
    )


def _level(plan: CostAwareTreePlan, level: int, parents, children, parent_values=None):
    """The plan's level rule for one row at `level`: frontier log-probabilities `parents` (F,), the children's top-k
    log-probabilities `children` (F, k), the frontier's values (F,; None at the first level)."""
    rules = LevelRules.of([plan], [plan.depth], torch.device("cpu"))
    values = None if parent_values is None else parent_values[None]
    return rules, rules.select(level, parents[None], values, children[None])


def _kept_pairs(choice) -> list[tuple[int, int]]:
    return [tuple(pair) for pair in (~choice.drop[0]).nonzero().tolist()]


def test_a_plan_keeps_the_children_worth_their_cost_within_sages_widths():
    plan = _plan(node_floor=0.2)
    probs = torch.tensor([[0.6, 0.3, 0.05, 0.05]])
    _, first = _level(plan, 1, torch.zeros(1), probs.log())
    assert _kept_pairs(first) == [(0, 0), (0, 1)]
    probs = torch.tensor([[0.5, 0.45, 0.03, 0.02], [0.9, 0.1, 0.0, 0.0]])
    _, second = _level(plan, 2, torch.tensor([0.6, 0.3]).log(), probs.log(), first.values[0, 0, :2])
    assert _kept_pairs(second) == [(0, 0), (0, 1), (1, 0)]


def test_a_plan_keeps_only_the_root_when_no_child_is_worth_its_cost():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    assert _kept_pairs(_level(_plan(node_floor=0.9), 1, torch.zeros(1), probs)[1]) == []
    assert _kept_pairs(_level(_plan(node_floor=0.9, explore=True), 1, torch.zeros(1), probs)[1]) == [(0, 0)]


def test_the_policy_explores_the_drafts_first_guess_every_few_steps():
    policy = SageGtPolicy(SageGtConfig(warmup_steps=1, explore_every=3))
    explored = []
    for _ in range(8):
        plan = policy.plan()
        explored.append(plan.explore if isinstance(plan, CostAwareTreePlan) else None)
        policy.observe(chain_step(torch.zeros(20), accepted=1))
    assert explored == [None, False, False, True, False, False, True, False]


def test_a_plan_drafts_another_level_only_when_it_pays_for_the_forward():
    probs = torch.tensor([[0.9, 0.05, 0.03, 0.02]]).log()
    for price, pays in ((0.3, True), (0.5, False)):
        rules, choice = _level(_plan(node_floor=0.1, forward_floor=(price, 0.01)), 1, torch.zeros(1), probs)
        kept = (~choice.drop).flatten(1).sum(1)
        assert rules.pays(choice, kept).tolist() == [pays]


def test_rows_without_a_forward_price_always_pay():
    probs = torch.tensor([[[0.9, 0.05, 0.03, 0.02]]] * 2).log()
    plans = [_plan(node_floor=0.1, forward_floor=(0.5, 0.01)), RankTreePlan([[0], [0, 0]])]
    rules = LevelRules.of(plans, [2, 2], torch.device("cpu"))
    choice = rules.select(1, torch.zeros(2, 1), None, probs)
    assert rules.pays(choice, (~choice.drop).flatten(1).sum(1)).tolist() == [False, True]


def test_a_masked_plan_grows_the_levels_it_was_given_and_an_unmasked_one_its_bound():
    plan = CostAwareTreePlan(
        4.0, 16, 64, 4, AcceptanceCalibration(), node_floor=0.1, forward_floor=(0.3, 0.01), paying_levels=3
    )
    assert (plan.levels(masked=True), plan.levels(masked=False)) == (3, 16)


def test_a_dropped_parents_children_are_worthless():
    plan = _plan(node_floor=0.2)
    _, first = _level(plan, 1, torch.zeros(1), torch.tensor([[0.6, 0.3, 0.05, 0.05]]).log())
    assert (~first.drop[0, 0]).tolist() == [True, True, False, False]
    parent_values = first.values[0, 0].masked_fill(first.drop[0, 0], 0.0)
    child = torch.tensor([[0.9, 0.1, 0.0, 0.0]] * 4).log()
    _, second = _level(plan, 2, torch.zeros(4), child, parent_values)
    assert _kept_pairs(second) == [(0, 0), (1, 0)]


def test_the_policy_sizes_masked_levels_by_how_deep_the_last_trees_levels_paid():
    policy = SageGtPolicy()
    chain = [0, 0, 1, 2]
    confident = [0.0, -0.01, -0.02, -0.03]
    assert policy.paying_levels((0.0, 0.0)) == policy.config.max_depth
    policy.state.last_tree = (chain, confident)
    assert policy.paying_levels((0.0, 0.0)) == 4
    assert policy.paying_levels((10.0, 0.0)) == 1
    doubtful = [0.0, -0.01, -5.0, -10.0]
    policy.state.last_tree = (chain, doubtful)
    assert policy.paying_levels((0.3, 0.0)) == 2


def test_the_policy_plans_with_sage_until_its_cost_model_is_warm():
    policy = SageGtPolicy(SageGtConfig(warmup_steps=3))
    one_hot = torch.full((20,), -1e9)
    one_hot[0] = 0.0
    for _ in range(3):
        assert not isinstance(policy.plan(), CostAwareTreePlan)
        lesson = policy.observe(chain_step(one_hot, accepted=2))
        assert (lesson.predicted_tokens, lesson.predicted_seconds) == (None, None)
    assert isinstance(policy.plan(), CostAwareTreePlan)
    lesson = policy.observe(chain_step(one_hot, accepted=2))
    assert lesson.predicted_tokens > 1.0
    assert lesson.predicted_seconds == pytest.approx(0.03, rel=1e-3)


def test_observe_hands_back_the_alpha_sage_planned_the_steps_tree_with():
    """The alpha that shaped the step's tree (SAGE's initial 0.5 at the first step), not the confident root the step
    measured."""
    policy = SageGtPolicy()
    one_hot = torch.full((20,), -1e9)
    one_hot[0] = 0.0
    policy.plan()
    assert policy.observe(chain_step(one_hot, accepted=2)).alpha == 0.5


def test_what_the_policy_learned_outlives_a_call():
    policy = SageGtPolicy(SageGtConfig(warmup_steps=2))
    for _ in range(3):
        policy.plan()
        policy.observe(chain_step(torch.zeros(20), accepted=2))
    policy.reset()
    assert not isinstance(policy.plan(), CostAwareTreePlan)
    policy.observe(chain_step(torch.zeros(20), accepted=2))
    assert isinstance(policy.plan(), CostAwareTreePlan)
    assert policy.cost.observations == 4
    assert policy.rate == pytest.approx(3 / 0.03)


def batch_step(rows: int, first: bool, accepted: int = 2):
    """A row's outcome of a batched step of `rows` rows, each with a 3-token chain."""
    step = chain_step(torch.zeros(20), accepted=accepted)
    step.batch = BatchShape(rows, rows * 4, 3, rows * 3, rows * (accepted + 1), 100, 100, first)
    return step


def test_rows_of_a_batch_share_the_cost_model_and_record_each_step_once():
    policy = SageGtPolicy(SageGtConfig(warmup_steps=2))
    rows = [policy.for_row() for _ in range(4)]
    for _ in range(3):
        for b, row in enumerate(rows):
            row.plan()
            row.observe(batch_step(4, first=b == 0))
    assert policy.cost.observations == 3
    assert all(row.cost is policy.cost and row.calibration is policy.calibration for row in rows)
    assert policy.rate == pytest.approx(4 * 3 / 0.03)


def test_a_batch_prices_a_node_at_the_batchs_rate_and_per_token_cost():
    alone, batched = SageGtPolicy(SageGtConfig(warmup_steps=2)), SageGtPolicy(SageGtConfig(warmup_steps=2))
    rng = np.random.default_rng(0)
    for _ in range(8):
        nodes = int(rng.integers(1, 6))
        step = chain_step(torch.zeros(20), accepted=nodes - 1, probs=[0.9] * nodes, verify_seconds=0.01 + 0.001 * nodes)
        alone.plan()
        alone.observe(step)
        tokens = 8 * (nodes + 1)
        step = chain_step(
            torch.zeros(20), accepted=nodes - 1, probs=[0.9] * nodes, verify_seconds=0.01 + 0.001 * tokens
        )
        step.batch = BatchShape(8, tokens, nodes, tokens, 8 * nodes, 100, 100, True)
        row = batched.for_row()
        row.plan()
        row.observe(step)
    assert batched.rate > alone.rate
    assert row.plan().node_floor > alone.plan().node_floor


def priced_batch(rows: int, rate: float) -> tuple[SageGtPolicy, list[SageGtPolicy]]:
    """A warm policy whose batch verification costs 2 ms a token, at `rate` tokens per second, and `rows` rows of it
    past their first step."""
    policy = SageGtPolicy(SageGtConfig(warmup_steps=2))
    for tokens in (8, 16, 24, 32):
        policy.cost.add(StepCost(tokens, 100, 3, tokens, 100, 0.01 + 0.002 * tokens, 0.005))
    policy.rates.add(int(rate), 1.0)
    members = [policy.for_row() for _ in range(rows)]
    for row in members:
        row.state.first_step, row.state.contexts = False, (100, 100)
    return policy, members


def confident_chain(nodes: int) -> tuple[list[int], list[float]]:
    """A last tree: a chain of `nodes` draft tokens, each at conditional probability 0.99 (calibrated near 1)."""
    return list(range(-1, nodes)), [float(np.log(0.99)) * depth for depth in range(nodes + 1)]


def test_one_rows_large_tree_does_not_size_every_rows_tree_in_a_batch():
    policy, rows = priced_batch(4, rate=200.0)
    assert rows[0].plan().node_floor == pytest.approx(0.4, rel=0.05)
    rows[0].state.last_tree = confident_chain(8)
    for row in rows[1:]:
        row.state.last_tree = confident_chain(1)
    plans = policy.plan_batch(rows)
    # One node is worth a token of every row (all four first nodes are near 1); the second is worth it to one row.
    assert [plan.max_nodes for plan in plans] == [1, 1, 1, 1]


def test_a_batchs_node_cap_grows_back_while_the_trees_it_cut_still_pay():
    policy, rows = priced_batch(4, rate=200.0)
    for row in rows:
        row.state.last_tree = confident_chain(2)
    policy.shared.cap = 2
    assert {plan.max_nodes for plan in policy.plan_batch(rows)} == {5}


def test_a_row_just_admitted_to_a_batch_starts_from_the_first_levels_of_sages_first_tree():
    policy, rows = priced_batch(4, rate=200.0)
    for row in rows[:3]:
        row.state.last_tree = confident_chain(2)
    rows[3].state.first_step = True
    first = rows[3].plan()
    plans = policy.plan_batch(rows)
    cap = plans[0].max_nodes
    assert plans[3].max_nodes == cap < first.max_nodes
    assert plans[3].paths == first.paths[:cap]


def test_configuration_errors_name_the_setting():
    with pytest.raises(ValueError, match="warmup_steps cannot exceed cost_window"):
        SageGtConfig(warmup_steps=10, cost_window=5)
    with pytest.raises(ValueError, match="max_depth"):
        SageGtConfig(max_depth=0)
