"""The engine's row functions for one tree: a batch of one, for tests that state a rule on a single made-up tree."""

from __future__ import annotations

import torch

from vlmspec.engine.accept import Verdict, accept_greedy_rows, accept_sampled_rows, deepest_rows
from vlmspec.engine.acceptance import emitted_rows
from vlmspec.engine.tree import Tree


def accept_greedy(tree: Tree, target_choice: torch.Tensor) -> Verdict:
    """`accept_greedy_rows` of one tree; `target_choice` (N,)."""
    return accept_greedy_rows(tree.rows(), target_choice[None]).row(0)


def accept_sampled(tree: Tree, probs: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """`accept_sampled_rows` of one tree; `probs` (N, V)."""
    return accept_sampled_rows(tree.rows(), probs[None], None if generator is None else [generator]).row(0)


def deepest(tree: Tree, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`deepest_rows` of one tree; `accepted` (N,)."""
    path, depth, best = deepest_rows(tree.rows(), accepted[None])
    return path[0], depth[0], best[0]


def emitted_tokens(tree: Tree, verdict: Verdict) -> torch.Tensor:
    """`emitted_rows` of one tree: (depth + 1,)."""
    return emitted_rows(tree.rows(), verdict.as_rows())[0]


def made_tree(root: int, parents: list[int], tokens: list[int], log_probs: list[float] | None = None) -> Tree:
    """A tree of root token `root` and, for each further node in order (level by level, each after its parent), its
    parent (a node index), its token and its path log-probability (default 0)."""
    every_parent = [-1, *parents]
    depths = [0] * len(every_parent)
    ancestors = torch.eye(len(every_parent), dtype=torch.bool)
    for node in range(1, len(every_parent)):
        depths[node] = depths[every_parent[node]] + 1
        ancestors[node] |= ancestors[every_parent[node]]
    path_log_probs = [0.0, *(log_probs if log_probs is not None else [0.0] * len(parents))]
    return Tree(
        tokens=torch.tensor([root, *tokens]),
        parents=torch.tensor(every_parent),
        depths=torch.tensor(depths),
        log_probs=torch.tensor(path_log_probs),
        ancestors=ancestors,
        depth=max(depths),
    )
