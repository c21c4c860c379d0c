"""HeteroSpec's and confidence-modulated drafting's rules on made-up distributions and trees: the path entropy, the
bins, the depth extension and node cut, the confidence mix and the length map."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from one_tree import made_tree
from policy_steps import chain_step

from vlmspec import CalibrationError, ConfidenceConfig, HeteroSpecConfig, PathEntropyBins
from vlmspec.engine.tree import Trees
from vlmspec.eval.calibrate import fit_bins
from vlmspec.policies import AdaptiveTreePlan, ConfidencePolicy, HeteroSpecPolicy
from vlmspec.policies.confidence import draft_length, mean_chain_confidence, mixed_confidence
from vlmspec.policies.heterospec import (
    PathRecord,
    best_path_entropy,
    depth_extension,
    node_budget,
    terminal_confidence_rank,
    top_k_entropy,
)
from vlmspec.policies.sage import confidence as sage_confidence

NAN = math.nan


def made_trees(parents: list[int], log_probs: list[float], measured: torch.Tensor | None = None) -> Trees:
    """One row's tree: parents (root -1), path log-probabilities (the root's 0) and each node's measured values
    (N, s)."""
    tree = made_tree(0, parents[1:], list(range(1, len(parents))), log_probs[1:])
    return replace(tree.rows(), node_statistics=None if measured is None else measured[None])


def test_the_top_k_entropy_is_log_k_for_a_uniform_top_and_zero_for_one_token():
    assert float(top_k_entropy(torch.full((4,), -2.0))) == pytest.approx(math.log(4))
    assert float(top_k_entropy(torch.tensor([0.0, -torch.inf, -torch.inf]))) == pytest.approx(0.0)


def test_the_top_k_entropy_renormalises_the_top_probabilities():
    top = torch.tensor([0.5, 0.25]).log()
    p = torch.tensor([2 / 3, 1 / 3])
    assert float(top_k_entropy(top)) == pytest.approx(float(-(p * p.log()).sum()))


def test_the_best_path_is_the_leaf_whose_last_token_the_draft_was_surest_of_and_its_entropy_sums_its_ancestors():
    # root 0 -> 1 -> 3 (last token 0.9 given 1) and root 0 -> 2 (last token 0.3): leaf 3 wins.
    trees = made_trees([-1, 0, 0, 1], [0.0, math.log(0.6), math.log(0.3), math.log(0.6 * 0.9)])
    entropy = torch.tensor([[0.5, 0.25, 7.0, NAN]])
    assert float(best_path_entropy(trees, entropy)[0]) == pytest.approx(0.5 + 0.25)


def test_a_leaf_at_the_first_level_sums_the_roots_entropy_alone():
    trees = made_trees([-1, 0, 0], [0.0, math.log(0.2), math.log(0.8)])
    assert float(best_path_entropy(trees, torch.tensor([[1.5, NAN, NAN]]))[0]) == pytest.approx(1.5)


def test_heterospec_reads_sages_alpha_and_the_path_entropy_off_the_measured_top_k():
    top = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.5, 1e-9], [NAN, NAN, NAN]]).log()
    trees = made_trees([-1, 0, 1], [0.0, math.log(0.7), math.log(0.35)], top)
    policy = HeteroSpecPolicy(HeteroSpecConfig(bins=PathEntropyBins(edges=[1.0])))
    alpha, phi = policy.path_statistics(trees)[0].tolist()
    assert alpha == pytest.approx(sage_confidence(top[0], 3), abs=1e-6)
    assert phi == pytest.approx(float(top_k_entropy(top[0]) + top_k_entropy(top[1])), abs=1e-6)


def test_trees_without_measures_have_no_path_entropy_nor_alpha():
    policy = HeteroSpecPolicy(HeteroSpecConfig(bins=PathEntropyBins(edges=[1.0])))
    values = policy.path_statistics(made_trees([-1, 0], [0.0, -0.1]))
    assert values.shape == (1, 2) and bool(values.isnan().all())


def test_the_terminal_confidence_rank_counts_the_more_probable_nodes():
    log_probs = [0.0, -0.1, -0.5, -0.3]
    assert terminal_confidence_rank([-1, 0, 0, 1], log_probs, [0, 1, 3]) == 2
    assert terminal_confidence_rank([-1, 0, 0, 1], log_probs, [0, 1]) == 1


def test_a_bin_is_the_interval_of_its_edges():
    bins = PathEntropyBins(edges=[0.5, 1.0, 2.0])
    assert [bins.index(x) for x in (0.0, 0.5, 0.7, 1.5, 9.0)] == [0, 1, 1, 2, 3]
    assert bins.bins == 4


def test_bins_refuse_unsorted_edges():
    with pytest.raises(CalibrationError, match="ascending"):
        PathEntropyBins(edges=[1.0, 0.5])


def test_fitted_bins_split_where_the_rank_changes_with_the_entropy():
    records = [PathRecord(0.1 * (i % 10), 1, 5, True) for i in range(40)]
    records += [PathRecord(3.0 + 0.1 * (i % 10), 30, 1, True) for i in range(40)]
    bins = fit_bins(records, depth=3, min_leaf=5)
    assert 1 <= len(bins.edges) <= 7 and any(0.9 < e < 3.0 for e in bins.edges)
    assert sum(bins.counts) == 80
    assert bins.means[0] == pytest.approx(1.0) and bins.means[-1] == pytest.approx(30.0)


def test_fitting_takes_only_fully_accepted_paths_and_refuses_too_few():
    records = [PathRecord(0.5, 1, 2, False)] * 100 + [PathRecord(0.5, 1, 2, True)] * 3
    with pytest.raises(CalibrationError, match="only 3 fully accepted paths in 103"):
        fit_bins(records)


@pytest.mark.parametrize(("bin_index", "depth", "extension"), [(0, 5, 3), (1, 5, 2), (2, 5, 1), (3, 5, 0), (0, 8, 4)])
def test_the_low_entropy_bins_extend_the_depth_by_alpha_minus_their_index(bin_index, depth, extension):
    assert depth_extension(bin_index, depth, (0.3, 0.6, 1.0)) == extension


def test_an_explicit_alpha_replaces_half_the_depth_and_the_extension_never_goes_negative():
    assert depth_extension(0, 8, (0.3, 0.6, 1.0), alpha=1) == 1
    assert depth_extension(2, 8, (0.3, 0.6, 1.0), alpha=1) == 0


@pytest.mark.parametrize(("bin_index", "budget"), [(0, 22), (1, 40), (2, 65), (3, 64), (7, 64)])
def test_the_low_entropy_bins_cut_the_nodes_to_gamma_n_plus_the_extension(bin_index, budget):
    extension = depth_extension(bin_index, 5, (0.3, 0.6, 1.0))
    assert node_budget(bin_index, 64, extension, (0.3, 0.6, 1.0)) == budget


def low_entropy_policy(entropy: float) -> HeteroSpecPolicy:
    """A policy with bins [0.5, 1.0, 2.0) after one step whose best path had `entropy` (a confident root)."""
    policy = HeteroSpecPolicy(HeteroSpecConfig(bins=PathEntropyBins(edges=[0.5, 1.0, 2.0])))
    policy.plan()
    step = chain_step(torch.tensor([0.0] + [-30.0] * 49), accepted=3)
    step.statistics = [1.0, entropy]
    policy.observe(step)
    return policy


def test_a_low_entropy_step_makes_the_next_tree_deeper_and_smaller_than_sages():
    sage = low_entropy_policy(5.0).plan()
    plan = low_entropy_policy(0.1).plan()
    assert isinstance(plan, AdaptiveTreePlan) and plan.node_measure is not None
    assert (sage.depth, sage.max_nodes) == (8, 64)
    assert (plan.depth, plan.max_nodes) == (8 + 4, round(0.3 * 64) + 4)


def test_a_step_without_a_measure_keeps_the_last_bin():
    policy = low_entropy_policy(0.1)
    step = chain_step(torch.tensor([0.0] + [-30.0] * 49), accepted=2)
    step.statistics = [1.0, NAN]
    policy.observe(step)
    assert policy.plan().depth == 12


def test_a_heterospec_config_checks_its_gammas():
    with pytest.raises(ValueError, match="gammas"):
        HeteroSpecConfig(gammas=(0.3, 1.5))


def test_a_one_hot_distribution_has_full_confidence_and_a_uniform_one_almost_none():
    one_hot = torch.tensor([0.0] + [-torch.inf] * 7)
    uniform = torch.full((8,), -math.log(8))
    weights = (1 / 3, 1 / 3, 1 / 3)
    assert float(mixed_confidence(one_hot, one_hot.topk(2).values, weights, 1.0)) == pytest.approx(1.0)
    # entropy 0, logit margin sigmoid(0) = 0.5, softmax margin 0
    assert float(mixed_confidence(uniform, uniform.topk(2).values, weights, 1.0)) == pytest.approx(0.5 / 3, abs=1e-6)


def test_the_confidence_mix_weights_its_three_measures():
    p = torch.tensor([0.5, 0.3, 0.2])
    log_probs = p.log()
    entropy = 1 - float(-(p * p.log()).sum()) / math.log(3)
    margin = 1 / (1 + math.exp(-2.0 * math.log(0.5 / 0.3)))
    softmax = 0.2
    mixed = mixed_confidence(log_probs, log_probs[:1], (0.5, 0.25, 0.25), 2.0)
    assert float(mixed) == pytest.approx(0.5 * entropy + 0.25 * margin + 0.25 * softmax, rel=1e-5)


@pytest.mark.parametrize(("confidence", "length"), [(1.0, 8), (0.99, 7), (0.5, 4), (0.1, 1), (0.0, 1)])
def test_the_draft_length_is_the_floored_confidence_share_of_k_max_within_its_bounds(confidence, length):
    assert draft_length(confidence, ConfidenceConfig()) == length


def test_aggressiveness_and_k_min_bound_the_length():
    config = ConfidenceConfig(aggressiveness=0.5, k_min=2, initial_length=2)
    assert draft_length(1.0, config) == 4 and draft_length(0.0, config) == 2


def test_confidence_weights_must_sum_to_one():
    with pytest.raises(ValueError, match="summing to 1"):
        ConfidenceConfig(weights=(0.5, 0.5, 0.5))


def test_the_chains_confidence_is_the_mean_over_its_measured_positions():
    trees = made_trees([-1, 0, 1, 2], [0.0, -0.1, -0.2, -0.3], torch.tensor([[0.8], [0.6], [0.4], [NAN]]))
    assert float(mean_chain_confidence(trees)[0]) == pytest.approx(0.6)


def test_the_next_chain_follows_the_last_chains_confidence():
    policy = ConfidencePolicy()
    assert policy.plan().depth == 5
    step = chain_step(torch.zeros(4), accepted=2)
    step.statistics = [0.9]
    policy.observe(step)
    assert policy.plan().depth == 7 and policy.plan().node_measure is not None


def test_a_batch_drafts_its_longest_rows_chain():
    policy = ConfidencePolicy()
    rows = [policy.for_row() for _ in range(3)]
    for row, confidence in zip(rows, (0.2, 0.9, 0.5), strict=True):
        step = chain_step(torch.zeros(4), accepted=1)
        step.statistics = [confidence]
        row.observe(step)
    plans = policy.plan_batch(rows)
    assert {plan.depth for plan in plans} == {7} and len({id(plan) for plan in plans}) == 1


def test_sampled_rows_of_a_batch_draft_their_own_chains():
    policy = ConfidencePolicy()
    rows = [policy.for_row() for _ in range(2)]
    step = chain_step(torch.zeros(4), accepted=1)
    step.statistics = [0.9]
    rows[1].observe(step)
    assert [plan.depth for plan in policy.plan_batch(rows, timed=False)] == [5, 7]
