"""Recursive rejection sampling on made-up trees and target distributions, no model: what a step emits (the accepted
draft tokens, then the bonus token) follows the target's distribution exactly, whatever the tree, with ties between
tokens, children the target gives no mass (as warpers cut them), children covering the whole support, and a tree that
is only a root. The exact distribution is enumerated from the tree; a wrong rule fails the same test."""

from __future__ import annotations

import pytest
import torch
from one_tree import accept_sampled, made_tree

from vlmspec.engine.accept import (
    Verdict,
    accept_greedy_rows,
    accept_sampled_rows,
    draw,
    draw_with,
    sampled_verdict,
    sampling_noise,
)
from vlmspec.engine.tree import Tree, Trees, rank_tree_shape
from vlmspec.testing.distribution import g_test

VOCAB = 5
DRAWS = 4000
ALPHA = 1e-3


def tree_of(root: int, levels: list[tuple[list[int], list[int]]]) -> Tree:
    """A tree from its root token and, per level, each new node's parent (a node index) and token; children of a
    node are in the order given (the draft's rank order)."""
    parents = [parent for level_parents, _ in levels for parent in level_parents]
    return made_tree(root, parents, [token for _, level_tokens in levels for token in level_tokens])


def exact_emissions(tree: Tree, probs: torch.Tensor) -> dict[tuple[int, ...], float]:
    """Every token sequence a step can emit and its probability under the target alone: at each node the next token
    follows that node's distribution; a token that is one of its children descends into it, any other ends the step
    as the bonus token."""
    children: dict[int, dict[int, int]] = {}
    for node in range(1, tree.size):
        children.setdefault(int(tree.parents[node]), {})[int(tree.tokens[node])] = node
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], mass: float) -> None:
        for token in range(VOCAB):
            p = mass * float(probs[node, token])
            if p == 0:
                continue
            child = children.get(node, {}).get(token)
            if child is None:
                out[prefix + (token,)] = out.get(prefix + (token,), 0.0) + p
            else:
                walk(child, prefix + (token,), p)

    walk(0, (), 1.0)
    return out


def emitted(tree: Tree, verdict: Verdict) -> tuple[int, ...]:
    count = int(verdict.accepted)
    return tuple(int(tree.tokens[n]) for n in verdict.path[1 : count + 1]) + (int(verdict.bonus),)


def distribution(*rows: list[float]) -> torch.Tensor:
    """Per node, its target distribution over the `VOCAB` tokens (rows normalised)."""
    table = torch.tensor(rows, dtype=torch.float64)
    return (table / table.sum(-1, keepdim=True)).float()


CASES = {
    # root -> a(1), b(2), c(3); a -> d(0), e(4); d -> f(2)
    "a tree": (
        tree_of(0, [([0, 0, 0], [1, 2, 3]), ([1, 1], [0, 4]), ([4], [2])]),
        distribution(
            [0.1, 0.4, 0.2, 0.2, 0.1],
            [0.3, 0.1, 0.1, 0.2, 0.3],
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.5, 0.1, 0.1, 0.2, 0.1],
            [0.1, 0.1, 0.6, 0.1, 0.1],
            [0.25, 0.25, 0.2, 0.15, 0.15],
            [0.2, 0.2, 0.2, 0.2, 0.2],
        ),
    ),
    # Ties: the root's two children have the same mass as the best other token.
    "ties": (
        tree_of(0, [([0, 0], [1, 2]), ([1], [3])]),
        distribution([0.1, 0.3, 0.3, 0.3, 0.0], [0.2] * 5, [0.2] * 5, [0.0, 0.5, 0.0, 0.5, 0.0]),
    ),
    # Warped: the target gives the first child no mass (a warper cut it) and most tokens none.
    "children the target cut": (
        tree_of(0, [([0, 0], [1, 2]), ([2], [4])]),
        distribution([0.0, 0.0, 0.7, 0.3, 0.0], [0.2] * 5, [0.0, 0.0, 0.0, 0.4, 0.6], [0.0, 1.0, 0.0, 0.0, 0.0]),
    ),
    # The root's children cover its whole support: the bonus token only ever follows a child.
    "children covering the support": (
        tree_of(0, [([0, 0], [1, 2]), ([1, 2], [3, 3])]),
        distribution(
            [0.0, 0.6, 0.4, 0.0, 0.0], [0.5, 0.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.5, 0.5], [0.2] * 5, [0.2] * 5
        ),
    ),
    "only a root": (tree_of(0, []), distribution([0.1, 0.2, 0.3, 0.4, 0.0])),
}


def draws(rule, tree: Tree, probs: torch.Tensor) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(0)
    return [emitted(tree, rule(tree, probs, generator)) for _ in range(DRAWS)]


@pytest.mark.parametrize("case", list(CASES))
def test_what_a_step_emits_follows_the_targets_exact_distribution(case):
    tree, probs = CASES[case]
    result = g_test(draws(accept_sampled, tree, probs), exact_emissions(tree, probs))
    assert result.passes(ALPHA), result


def _bonus_from_p(tree: Tree, probs: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """A wrong rule: recursive rejection, but the bonus token drawn from p, the rejected children included."""
    verdict = accept_sampled(tree, probs, generator)
    return Verdict(verdict.path, verdict.accepted, draw(probs[verdict.path[verdict.accepted]], generator))


def test_the_same_test_rejects_a_rule_that_draws_the_bonus_token_with_the_rejected_children():
    tree, probs = CASES["a tree"]
    result = g_test(draws(_bonus_from_p, tree, probs), exact_emissions(tree, probs))
    assert not result.passes(ALPHA)


def _rows_near_their_budget() -> tuple[Trees, torch.Tensor, list[int]]:
    """Three trees of one shape, each row with its own tokens and target distributions (B, N, V), rows near their
    budget (their depths returned) with their deeper nodes invalid."""
    shape = rank_tree_shape([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], torch.device("cpu"))
    tokens = torch.tensor([[0, 1, 2, 3, 0, 4, 2], [0, 3, 4, 1, 2, 0, 1], [2, 2, 0, 4, 3, 1, 0]])
    depths = [3, 1, 2]
    valid = shape.depths[None] <= torch.tensor(depths)[:, None]
    trees = Trees(tokens, torch.zeros(tokens.shape), shape.parents, shape.depths, shape.ancestors, 3, valid)
    generator = torch.Generator().manual_seed(3)
    probs = torch.rand(3, shape.size, VOCAB, generator=generator)
    probs[0, 1, 2] = 0.0  # a child the target gives no mass, as a warper cuts it
    probs[1, 0] = torch.tensor([0.0, 0.0, 0.0, 0.5, 0.5])  # the root's children cover its support
    return trees, probs / probs.sum(-1, keepdim=True), depths


def _assert_rows_follow_their_trees(trees: Trees, probs: torch.Tensor, depths: list[int], emitted_rows) -> None:
    """Each row's emissions follow the exact distribution of its own tree cut at its depth, and never pass it."""
    for b, depth in enumerate(depths):
        n = int((trees.depths <= depth).sum())
        own = Tree(
            trees.tokens[b, :n], trees.parents[:n], trees.depths[:n], torch.zeros(n), trees.ancestors[:n, :n], depth
        )
        assert max(len(tokens) for tokens in emitted_rows[b]) <= depth + 1
        result = g_test(emitted_rows[b], exact_emissions(own, probs[b, :n]))
        assert result.impossible == 0 and result.passes(ALPHA), (b, result)


def test_every_row_of_a_batch_emits_its_own_trees_exact_distribution():
    """Recursive rejection over a batch of trees of one shape, rows near their budget, all rows drawn at once from
    the global RNG: what each row emits follows the exact distribution of its own (cut) tree."""
    trees, probs, depths = _rows_near_their_budget()
    torch.manual_seed(0)
    emitted_rows: list[list[tuple[int, ...]]] = [[] for _ in depths]
    for _ in range(DRAWS):
        verdict = accept_sampled_rows(trees, probs)
        for b in range(len(depths)):
            emitted_rows[b].append(emitted(trees.row(b), verdict.row(b)))
    _assert_rows_follow_their_trees(trees, probs, depths, emitted_rows)


def test_the_rule_compiled_as_one_region_draws_each_rows_exact_distribution_from_noise_drawn_before_it():
    """The rule as a compiled region (`sampled_verdict`, no graph break), fed noise drawn outside it: every row's
    emissions follow its own tree's exact distribution. The draws are rows of one batch (the trees repeated)."""
    trees, probs, depths = _rows_near_their_budget()
    rows = len(depths)
    many = Trees(
        trees.tokens.repeat(DRAWS, 1),
        trees.log_probs.repeat(DRAWS, 1),
        trees.parents,
        trees.depths,
        trees.ancestors,
        trees.depth,
        trees.valid.repeat(DRAWS, 1),
    )
    torch.manual_seed(0)
    noise = sampling_noise(rows * DRAWS, trees.size, VOCAB)
    verdict = torch.compile(sampled_verdict, fullgraph=True)(many, probs.repeat(DRAWS, 1, 1), noise)
    emitted_rows = [[emitted(many.row(i), verdict.row(i)) for i in range(b, rows * DRAWS, rows)] for b in range(rows)]
    _assert_rows_follow_their_trees(trees, probs, depths, emitted_rows)


def test_the_bonus_draw_is_torch_multinomials_draw_from_the_same_random_state():
    """The bonus token is drawn as `torch.multinomial` draws one sample (argmax of p over Exp(1) noise), so a seeded
    sampler draws what `generate`'s `torch.multinomial` draws, and leaves the random state where it leaves it."""
    weights = torch.rand(6, 1000, generator=torch.Generator().manual_seed(0)) ** 4
    weights[:, ::3] = 0.0
    for seed in range(5):
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for row in weights:
            assert int(draw(row, ours)) == int(torch.multinomial(row, 1, generator=theirs)[0])
        assert torch.equal(torch.rand(3, generator=ours), torch.rand(3, generator=theirs))
        torch.manual_seed(seed)
        noise = sampling_noise(6, 1, 1000)
        together = draw_with(weights, noise.exponentials)
        torch.manual_seed(seed)
        torch.rand(6, 1)
        assert together.tolist() == torch.multinomial(weights, 1)[:, 0].tolist()


def test_compiled_greedy_acceptance_of_a_wide_tree_equals_eager():
    """Past 16 nodes, depths the accepted path does not reach find no node: the argmax over such an all-false row must
    still give node 0 when compiled, as eager (over uint8, inductor's CPU argmax once returned garbage there)."""
    chain = [[0] * depth for depth in range(1, 8)]
    siblings = [[rank] for rank in range(1, 16)]
    shape = rank_tree_shape(chain + siblings, torch.device("cpu"))
    n = shape.parents.shape[0]
    tokens = torch.arange(n)[None].repeat(2, 1)
    trees = Trees(tokens, torch.zeros(tokens.shape), shape.parents, shape.depths, shape.ancestors, 7)
    target_choice = torch.zeros(2, n, dtype=torch.long)
    target_choice[0, 0] = tokens[0, 1]  # row 0 accepts the first chain node, row 1 nothing
    eager = accept_greedy_rows(trees, target_choice)
    compiled = torch.compile(accept_greedy_rows, fullgraph=True, dynamic=False)(trees, target_choice)
    assert n > 16 and eager.accepted.tolist() == [1, 0]
    assert [compiled.path.tolist(), compiled.accepted.tolist()] == [eager.path.tolist(), eager.accepted.tolist()]
