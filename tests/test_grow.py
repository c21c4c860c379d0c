"""Growing every row's own tree at once: rows of any mix of plans get the trees they would grow alone."""

from __future__ import annotations

import pytest
import torch

from vlmspec.engine.grow import GrowthInputs, draft_own_trees, draft_rows
from vlmspec.engine.tree import rank_tree_shape
from vlmspec.policies import SPECVLM_TREE, AdaptiveTreePlan, CostAwareTreePlan, RankTreePlan
from vlmspec.policies.calibration import AcceptanceCalibration

VOCAB = 12


class TableDraft:
    """A draft whose next-token logits depend on the last token fed alone (a fixed random table), over rows of
    `lengths` cached tokens: enough of a `ModelRunner` for the growth. With `captures` the growth's own step
    functions run compiled, as they do beside a compiled draft."""

    def __init__(self, rows: int, seed: int = 0, captures: bool = False):
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(VOCAB, VOCAB, generator=generator) * 2.0
        self.lengths = [5] * rows
        self.captures = captures
        self.captured = {}
        self.guard = None

    def positions(self, lengths: torch.Tensor) -> torch.Tensor:
        return lengths

    def forward_rows(self, tokens, depths, start, visible, counts=None) -> torch.Tensor:
        return self.table[tokens]


def _grow(plans, roots: list[int], max_depth: int = 8, captures: bool = False):
    rows = len(plans)
    pending = torch.tensor(roots)[:, None]
    draft = TableDraft(rows, captures=captures)
    inputs = GrowthInputs(draft, pending, [1] * rows, [max_depth] * rows, VOCAB, VOCAB, [None] * rows, [None] * rows)
    return draft_own_trees(inputs, plans)


def _tree(grown, b: int) -> tuple[list[int], list[int], list[float]]:
    tree = grown.row(b).tree
    return tree.tokens.tolist(), tree.parents.tolist(), tree.log_probs.tolist()


def _sage(width: float = 4.0, masked: bool = False, max_nodes: int = 20, top_k: int = 6) -> AdaptiveTreePlan:
    return AdaptiveTreePlan(depth=4, width=width, max_nodes=max_nodes, top_k=top_k, threshold_scale=0.05, masked=masked)


def _sage_gt(explore: bool = False) -> CostAwareTreePlan:
    return CostAwareTreePlan(3.0, 6, 20, 6, AcceptanceCalibration(), 0.05, (0.2, 0.01), explore=explore)


@pytest.mark.parametrize(
    "plans",
    [
        [RankTreePlan(SPECVLM_TREE), _sage(), _sage(2.0)],
        [_sage(), RankTreePlan([[0], [1], [0, 0]]), RankTreePlan(SPECVLM_TREE)],
        [_sage_gt(), RankTreePlan(SPECVLM_TREE[:3]), _sage_gt(explore=True)],
        [_sage_gt(), _sage(), RankTreePlan([[0], [0, 0], [0, 0, 0]])],
        [RankTreePlan(SPECVLM_TREE), _sage(masked=True), _sage(2.0, masked=True)],
    ],
    ids=[
        "rank-tree-beside-sage",
        "rank-trees-of-other-shapes",
        "sage-gt-beside-a-capped-rank-tree",
        "all-three",
        "masked-levels",
    ],
)
def test_a_batch_mixing_plans_gives_each_row_the_tree_it_grows_alone(plans):
    roots = [1, 4, 7]
    together = _grow(plans, roots)
    for b, plan in enumerate(plans):
        alone = _grow([plan], [roots[b]])
        assert _tree(together, b) == _tree(alone, 0)


@pytest.mark.parametrize(
    "plans",
    [
        [RankTreePlan(SPECVLM_TREE), _sage(masked=True), _sage(2.0, masked=True), _sage_gt()],
        [_sage(masked=True, max_nodes=3), _sage(2.0, masked=True, max_nodes=3), _sage(8.0, masked=True, max_nodes=3)],
        [_sage(masked=True, max_nodes=7), _sage(2.0, masked=True, top_k=3), _sage(8.0, masked=True, max_nodes=5)],
    ],
    ids=["fixed-sage-and-valued", "caps-that-bind", "own-caps-and-top-ks"],
)
def test_masked_levels_grown_as_compiled_regions_are_the_levels_grown_eager(plans):
    """Compiled, a level applies the node cap and each row's own top-k whether or not they bind (where no row is
    valued): the trees are those eager levels grow."""
    roots = [1, 4, 7, 2][: len(plans)]
    compiled, eager = _grow(plans, roots, captures=True), _grow(plans, roots)
    for b in range(len(plans)):
        (tokens, parents, log_probs), (eager_tokens, eager_parents, eager_log_probs) = (
            _tree(compiled, b),
            _tree(eager, b),
        )
        assert (tokens, parents) == (eager_tokens, eager_parents)
        # A fused log-softmax rounds otherwise.
        assert log_probs == pytest.approx(eager_log_probs, abs=1e-5)
    assert compiled.sizes == eager.sizes and compiled.depths == eager.depths


@pytest.mark.parametrize("paths", [SPECVLM_TREE, [[0], [0, 0], [0, 0, 0]]], ids=["tree", "chain"])
def test_a_shared_shape_grown_as_compiled_regions_is_the_shape_grown_eager(paths):
    shape = rank_tree_shape(paths, torch.device("cpu"))
    pending = torch.tensor([[3], [5], [8]])

    def grow(captures: bool):
        inputs = GrowthInputs(
            TableDraft(3, captures=captures), pending, [1] * 3, [8] * 3, VOCAB, VOCAB, [None] * 3, [None] * 3
        )
        return draft_rows(inputs, shape, 6)

    compiled, eager = grow(True), grow(False)
    for b in range(3):
        (tokens, parents, log_probs), (eager_tokens, eager_parents, eager_log_probs) = (
            _tree(compiled, b),
            _tree(eager, b),
        )
        assert (tokens, parents) == (eager_tokens, eager_parents)
        assert log_probs == pytest.approx(eager_log_probs, abs=1e-5)


@pytest.mark.parametrize("paths", [SPECVLM_TREE, [[0], [0, 0], [0, 0, 0]], [[1], [0], [1, 2], [0, 0]]])
def test_a_rank_tree_grown_among_other_rows_is_the_tree_its_shape_grows(paths):
    plan = RankTreePlan(paths)
    grown = _grow([_sage(), plan, _sage_gt()], [2, 3, 9])
    shape = rank_tree_shape(plan.paths, torch.device("cpu"))
    pending = torch.tensor([[3]])
    shared = draft_rows(GrowthInputs(TableDraft(1), pending, [1], [8], VOCAB, VOCAB, [None], [None]), shape, plan.top_k)
    assert _tree(grown, 1) == _tree(shared, 0)


def test_a_row_near_its_budget_stops_at_its_own_depth():
    plans = [RankTreePlan(SPECVLM_TREE), _sage()]
    pending = torch.tensor([[3], [5]])
    inputs = GrowthInputs(TableDraft(2), pending, [1, 1], [2, 8], VOCAB, VOCAB, [None] * 2, [None] * 2)
    grown = draft_own_trees(inputs, plans)
    assert grown.depths[0] == 2 and grown.sizes[0] == 1 + 4 + 8
