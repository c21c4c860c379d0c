"""A batch's step as `(B, N)` tensors, on made-up tensors, no model: every row's tree of one rank-path shape, its
acceptance, the packing of its results and its commit equal what the row's own tree gives alone, rows near their
budget included (their deeper nodes invalid)."""

from __future__ import annotations

import pytest
import torch
from one_tree import accept_greedy, accept_sampled, emitted_tokens
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from vlmspec.engine.accept import Verdict, accept_greedy_rows, accept_sampled_rows, sampling_noise
from vlmspec.engine.acceptance import (
    StepReport,
    StepStatistics,
    TargetScoring,
    emitted_rows,
    pack_rows,
    scored_step,
)
from vlmspec.engine.commit import plan_commit
from vlmspec.engine.processing import NodeProcessing
from vlmspec.engine.tree import Tree, Trees, rank_tree_shape
from vlmspec.policies import RankTreePlan
from vlmspec.policies.sage import SageConfig, SagePolicy
from vlmspec.policies.static import SPECVLM_TREE

CPU = torch.device("cpu")
PATHS = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
VOCAB = 6


def rows_of(tokens: list[list[int]], valid_depths: list[int] | None = None) -> Trees:
    shape = rank_tree_shape(PATHS, CPU)
    tokens_tensor = torch.tensor(tokens)
    valid = None
    if valid_depths is not None:
        valid = shape.depths[None] <= torch.tensor(valid_depths)[:, None]
    return Trees(
        tokens_tensor,
        torch.zeros(tokens_tensor.shape, dtype=torch.float32),
        shape.parents,
        shape.depths,
        shape.ancestors,
        shape.depth,
        valid,
    )


def cut(tree: Tree, depth: int) -> Tree:
    """`tree` without its nodes deeper than `depth`."""
    n = int((tree.depths <= depth).sum())
    return Tree(tree.tokens[:n], tree.parents[:n], tree.depths[:n], tree.log_probs[:n], tree.ancestors[:n, :n], depth)


TOKENS = [[4, 1, 2, 3, 5, 0, 2], [0, 2, 3, 1, 4, 5, 1], [3, 3, 1, 0, 2, 4, 5]]


def test_a_rank_tree_shape_orders_nodes_by_level_then_parent_then_rank():
    shape = rank_tree_shape(PATHS, CPU)
    assert shape.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert shape.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert shape.ranks.tolist() == [0, 0, 1, 0, 1, 0, 0]
    assert shape.level_ends == [1, 3, 6, 7]
    assert [rows.tolist() for rows, _ in shape.children] == [[0, 0], [0, 0, 1], [0]]
    assert shape.ancestors[6].nonzero().squeeze(1).tolist() == [0, 1, 3, 6]


def test_a_rank_tree_shape_holds_as_many_nodes_as_its_plan():
    plan = RankTreePlan(SPECVLM_TREE)
    shape = rank_tree_shape(plan.paths, CPU)
    assert shape.size == plan.max_nodes + 1
    assert shape.depth == plan.depth


def test_greedy_acceptance_of_every_row_equals_each_rows_own():
    trees = rows_of(TOKENS)
    choice = torch.randint(0, VOCAB, (3, trees.size), generator=torch.Generator().manual_seed(0))
    choice[0, :] = torch.tensor([1, 3, 0, 0, 0, 0, 0])
    together = accept_greedy_rows(trees, choice)
    for b in range(3):
        alone = accept_greedy(trees.row(b), choice[b])
        assert torch.equal(together.row(b).path, alone.path)
        assert int(together.accepted[b]) == int(alone.accepted)
        assert int(together.bonus[b]) == int(alone.bonus)
    assert int(together.accepted[0]) == 2


def test_a_row_near_its_budget_never_accepts_its_invalid_nodes():
    trees = rows_of(TOKENS, valid_depths=[1, 3, 0])
    choice = torch.tensor([[1, 3, 0, 0, 0, 0, 0]] * 3)
    verdict = accept_greedy_rows(trees, choice)
    assert verdict.accepted.tolist()[0] == 1
    assert int(verdict.accepted[2]) == 0
    assert int(verdict.bonus[0]) == 3


def test_sampled_acceptance_of_every_row_draws_as_each_rows_own_tree_from_its_generator():
    depths = [3, 1, 2]
    trees = rows_of(TOKENS, valid_depths=depths)
    probs = torch.rand(3, trees.size, VOCAB, generator=torch.Generator().manual_seed(1)).softmax(-1)
    sizes = [int((trees.depths <= d).sum()) for d in depths]
    for seed in range(20):
        generators = [torch.Generator().manual_seed(seed * 10 + b) for b in range(3)]
        together = accept_sampled_rows(trees, probs, generators, sizes)
        for b in range(3):
            tree = cut(trees.row(b), depths[b])
            alone = accept_sampled(tree, probs[b, : tree.size], torch.Generator().manual_seed(seed * 10 + b))
            assert int(together.accepted[b]) == int(alone.accepted)
            assert int(together.bonus[b]) == int(alone.bonus)
            assert together.path[b, : depths[b] + 1].tolist() == alone.path.tolist()


def test_packed_rows_equal_each_rows_own_packing():
    trees = rows_of(TOKENS)
    choice = torch.tensor([[1, 3, 0, 0, 0, 0, 0], [2, 5, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    verdict = accept_greedy_rows(trees, choice)
    tokens = emitted_rows(trees, verdict)
    eos = torch.tensor([[3, -1], [4, 5], [9, -1]])
    rooms = [5, 1, 4]
    greedy = torch.tensor([3, 2, 1])
    statistics = torch.tensor([[0.5], [0.25], [1.0]])
    together = pack_rows(trees, verdict, tokens, eos, rooms, greedy, statistics, with_tree=True)
    for b in range(3):
        own = verdict.row(b)
        alone_tokens = emitted_tokens(trees.row(b), own)
        assert torch.equal(alone_tokens, tokens[b])
        alone = pack_rows(
            trees.row(b).rows(),
            own.as_rows(),
            tokens[b : b + 1],
            eos[b : b + 1],
            rooms[b : b + 1],
            greedy[b : b + 1],
            statistics[b : b + 1],
            with_tree=True,
        )
        assert together[b].tolist() == alone[0].tolist()


def test_the_compiled_greedy_acceptance_takes_the_policys_statistics_as_eager_packing_does():
    trees = rows_of(TOKENS)
    logits = torch.randn(3, trees.size, VOCAB, generator=torch.Generator().manual_seed(0))
    root_log_probs = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1)).log_softmax(-1)
    policy = SagePolicy(SageConfig(top_k=4, width_max=4.0))
    eos, rooms, greedy = torch.tensor([[3], [4], [9]]), torch.tensor([5, 1, 4]), torch.tensor([3, 2, 1])
    step = torch.compile(scored_step, fullgraph=True)
    greedy_scoring = TargetScoring(None, None, sample=False, compact=False)
    root = StepStatistics(policy, root_log_probs, trees)
    _, _, packed = step(trees, logits, greedy_scoring, None, eos, rooms, greedy, root, True)
    verdict = accept_greedy_rows(trees, logits.argmax(-1))
    tokens = emitted_rows(trees, verdict)
    statistics = policy.statistics(root_log_probs)
    eager = pack_rows(trees, verdict, tokens, eos, rooms, greedy, statistics, with_tree=True)
    torch.testing.assert_close(packed, eager)


@pytest.mark.parametrize("sample", [True, False], ids=["sampled", "greedy"])
def test_the_compiled_acceptance_under_a_configs_processing_equals_eager(sample):
    """A released-style config (repetition penalty, temperature, top-k, top-p) as one compiled region: its scores,
    warped distribution, verdict and packed rows equal eager ones, from the same noise drawn before it."""
    processors = [RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(8)]
    processing = NodeProcessing(LogitsProcessorList([*processors, TopPLogitsWarper(0.8)]))
    trees = rows_of(TOKENS, [3, 1, 2])
    vocab = 64
    logits = torch.randn(3, trees.size, vocab, generator=torch.Generator().manual_seed(0))
    sequences = torch.tensor([[5, 9, 4], [7, 7, 0], [1, 2, 3]])  # each row's tokens so far, ending with its root
    scoring = TargetScoring(processing, sequences, sample=sample, compact=True)
    torch.manual_seed(0)
    noise = sampling_noise(3, trees.size, vocab) if sample else None
    eos, rooms, greedy = torch.tensor([[3], [4], [9]]), torch.tensor([5, 1, 4]), torch.tensor([3, 2, 1])
    step = (trees, logits, scoring, noise, eos, rooms, greedy, None, True)
    eager = scored_step(*step)
    compiled = torch.compile(scored_step, fullgraph=True)(*step)
    assert compiled[0].path.tolist() == eager[0].path.tolist()
    assert compiled[1].tolist() == eager[1].tolist()
    torch.testing.assert_close(compiled[2], eager[2])


def test_the_commit_of_every_row_equals_each_rows_own():
    reports = [report([0, 1, 3, 6], [4, 1, 3, 9]), report([0, 2], [2, 7]), report([0], [8])]
    fed, cached, slots = [1, 2, 3], [2, 2, 3], [None, [0, 2, 3], None]
    together = plan_commit(reports, fed, cached, slots, CPU)
    for b in range(3):
        alone = plan_commit(reports[b : b + 1], fed[b : b + 1], cached[b : b + 1], slots[b : b + 1], CPU)
        for mine, own in zip(together.row(b), alone.row(0), strict=True):
            assert mine.tolist() == own.tolist()


def report(path: list[int], tokens: list[int]) -> StepReport:
    """A step's report as its read gives it: `path` from the root to the last accepted node, `tokens` the accepted
    draft tokens then the bonus token."""
    return StepReport(len(path) - 1, len(tokens), False, False, 0, tokens, path, [])


def test_a_verdict_row_is_a_view_of_the_batchs():
    verdict = Verdict(torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 2]), torch.tensor([5, 6]))
    assert int(verdict.row(1).bonus) == 6
    assert verdict.row(0).doubt is None
