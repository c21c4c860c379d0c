"""The tree as tensors: masks, positions, path retrieval, acceptance and cache bookkeeping."""

from __future__ import annotations

import torch
from one_tree import accept_greedy, made_tree

from vlmspec.engine.tree import rank_tree_shape, with_edges
from vlmspec.policies import SPECVLM_TREE, RankTreePlan, resolve_policy


def small_tree():
    """root(10) -> a(11), b(12); a -> c(13); c -> d(14)."""
    return made_tree(10, [0, 0, 1, 3], [11, 12, 13, 14], [-0.1, -2.0, -0.3, -0.4])


def test_tree_records_parents_depths_and_ancestors():
    tree = small_tree()
    assert tree.tokens.tolist() == [10, 11, 12, 13, 14]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 3]
    assert tree.depths.tolist() == [0, 1, 1, 2, 3]
    assert tree.depth == 3
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(tree.ancestors, expected)


def test_path_retrieval_goes_root_to_node():
    tree = small_tree()
    assert tree.path_to(4).tolist() == [0, 1, 3, 4]
    assert tree.path_to(2).tolist() == [0, 2]
    assert sorted(tree.leaf_paths()) == [[0, 1, 3, 4], [0, 2]]


def test_attention_bias_lets_each_node_see_prefix_and_ancestors_only():
    tree = small_tree()
    bias = tree.attention_bias(torch.float32, prefix_len=3)
    assert bias.shape == (1, 1, 5, 8)
    visible = bias[0, 0] == 0
    assert visible[:, :3].all()
    assert torch.equal(visible[:, 3:], tree.ancestors)
    assert (bias[0, 0][~visible] == torch.finfo(torch.float32).min).all()


def test_node_positions_are_root_position_plus_depth():
    tree = small_tree()
    root_position = 40
    assert (tree.depths + root_position).tolist() == [40, 41, 41, 42, 43]


def test_acceptance_follows_the_target_down_the_longest_agreeing_path():
    tree = small_tree()
    choice = torch.tensor([11, 13, 99, 14, 77])
    verdict = accept_greedy(tree, choice)
    assert verdict.path.tolist() == [0, 1, 3, 4]
    assert (int(verdict.accepted), int(verdict.bonus)) == (3, 77)


def test_acceptance_stops_at_the_first_disagreement():
    tree = small_tree()
    verdict = accept_greedy(tree, torch.tensor([12, 13, 55, 14, 77]))
    assert (verdict.path.tolist(), int(verdict.accepted), int(verdict.bonus)) == ([0, 2, 0, 0], 1, 55)
    verdict = accept_greedy(tree, torch.tensor([5, 13, 55, 14, 77]))
    assert (verdict.path.tolist(), int(verdict.accepted), int(verdict.bonus)) == ([0, 0, 0, 0], 0, 5)


def test_static_plan_reproduces_the_specvlm_tree():
    plan = RankTreePlan(SPECVLM_TREE)
    assert (plan.depth, plan.max_nodes, plan.top_k) == (5, 25, 4)
    ends = rank_tree_shape(plan.paths, torch.device("cpu")).level_ends
    level_sizes = [end - start for start, end in zip(ends[:-1], ends[1:], strict=True)]
    assert level_sizes == [4, 8, 8, 3, 2]
    assert plan.rule(plan.depth).keep[0].tolist() == [[True, True, True, True]]


def test_causal_mask_for_pending_tokens_sees_cache_and_earlier_tokens():
    from vlmspec.engine.tree import additive_mask

    causal = torch.ones(3, 3, dtype=torch.bool).tril_()
    visible = additive_mask(causal, torch.float32, prefix_len=2)[0, 0] == 0
    assert visible.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


def test_a_batchs_rows_share_their_policys_fixed_plan():
    """Each row gets its own copy of the policy; a fixed plan never changes, so the copies share it."""
    policy = resolve_policy("static-tree")
    rows = [policy.for_row() for _ in range(3)]
    assert all(row is not policy and row.plan() is policy.plan() for row in rows)


def test_visibility_blocks_of_many_trees_get_their_edges_each():
    blocks = torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(0)) > 0.5
    edged = with_edges(blocks)
    for b in range(3):
        assert torch.equal(edged[b], with_edges(blocks[b]))
    assert edged[..., 0].all() and not edged[..., -1].any() and torch.equal(edged[..., 1:-1], blocks)
