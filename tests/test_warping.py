"""The warped distribution at tree nodes: top-p and the like on a top-k's columns, fixed shapes, and the doubt flag
that sends a step back to the full rows when ties could make the compact rows differ from `generate`'s."""

from __future__ import annotations

import torch
from one_tree import made_tree
from transformers import LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from vlmspec.engine.acceptance import accept_trees
from vlmspec.engine.draft import Drafted, GrownTrees
from vlmspec.engine.processing import NodeProcessing, TargetSampler
from vlmspec.eval.profile import LaunchCounter

SEQUENCE = torch.zeros(1, 3, dtype=torch.long)
WARPERS = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(3), TopPLogitsWarper(0.8)])


def generate_distribution(scores: torch.Tensor) -> torch.Tensor:
    """What `generate` samples from: every warper on full rows, then a softmax."""
    return WARPERS(SEQUENCE.expand(scores.shape[0], -1), scores.clone()).softmax(-1)


def test_the_compact_distribution_is_generates_when_nothing_ties():
    scores = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    probs, doubt = NodeProcessing(WARPERS).distribution(scores.clone(), SEQUENCE)
    assert not bool(doubt)
    torch.testing.assert_close(probs, generate_distribution(scores))


def test_a_tie_at_the_kth_score_raises_doubt_and_the_full_rows_are_generates():
    scores = torch.randn(2, 40, generator=torch.Generator().manual_seed(1))
    third = scores[1].topk(3).values[-1]
    scores[1, scores[1] < third] = -5.0
    scores[1, 0] = third  # a fourth token ties the third best: the top-k keeps four
    probs, doubt = NodeProcessing(WARPERS).distribution(scores.clone(), SEQUENCE)
    assert bool(doubt)
    full, doubt = NodeProcessing(WARPERS).distribution(scores.clone(), SEQUENCE, compact=False)
    assert not bool(doubt)
    torch.testing.assert_close(full, generate_distribution(scores))


def test_top_p_cutting_between_equal_scores_raises_doubt():
    """Kept probabilities 0.7, 0.15, 0.15: top-p 0.8 keeps one of the two equal tokens, whichever a sort put last."""
    scores = torch.full((1, 40), -10.0)
    scores[0, :3] = torch.tensor([0.7 * torch.tensor(0.7 / 0.15).log().item(), 0.0, 0.0])
    probs, doubt = NodeProcessing(WARPERS).distribution(scores.clone(), SEQUENCE)
    assert bool(doubt)
    full, _ = NodeProcessing(WARPERS).distribution(scores.clone(), SEQUENCE, compact=False)
    torch.testing.assert_close(full, generate_distribution(scores))


def test_equal_scores_on_one_side_of_the_cut_leave_no_doubt():
    scores = torch.full((1, 40), -10.0)
    scores[0, :3] = torch.tensor([2.0, 2.0, -1.0])
    probs, doubt = NodeProcessing(WARPERS).distribution(scores.clone(), SEQUENCE)
    assert not bool(doubt)
    torch.testing.assert_close(probs, generate_distribution(scores))


def accept_counting_reads(logits: torch.Tensor):
    """Accept a two-child tree under a top-k/top-p sampler from the target's `logits` (3, 40), counting host reads."""
    tree = made_tree(1, [0, 0], [2, 3], [-0.1, -2.0])
    drafted = Drafted(tree, torch.zeros(40), 1, torch.tensor(1), 1, 1)
    sampler = TargetSampler(NodeProcessing(WARPERS), do_sample=True, generator=torch.Generator().manual_seed(0))
    counter = LaunchCounter(torch.nn.Identity())
    with counter.counting():
        accepted = accept_trees(
            GrownTrees.one(drafted),
            tree.rows(),
            logits[None],
            [sampler],
            [SEQUENCE],
            torch.tensor([[-1]]),
            [10],
            None,
            False,
        )
    return accepted.reports[0], counter.reads["own"]


def test_warping_a_tree_waits_for_nothing_before_the_steps_one_read():
    report, reads = accept_counting_reads(torch.randn(3, 40, generator=torch.Generator().manual_seed(3)))
    assert reads == 1 and not report.doubt


def test_a_tree_in_doubt_is_accepted_again_from_the_full_rows_with_a_second_read():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    third = logits[0].topk(3).values[-1]
    logits[0, logits[0] < third] = -5.0
    logits[0, 0] = third  # the root's top-k keeps four tokens
    report, reads = accept_counting_reads(logits)
    assert reads == 2 and not report.doubt and report.count >= 1
