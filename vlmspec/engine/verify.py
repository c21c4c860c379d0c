"""Verification: one target forward over the whole tree, then greedy acceptance of the longest agreeing path."""

from __future__ import annotations

import torch

from .choice import TargetChoice
from .runner import ModelRunner
from .tree import DraftTree


def verify_tree(runner: ModelRunner, tree: DraftTree, choice: TargetChoice, sequence: torch.Tensor) -> torch.Tensor:
    """The target's token after every node (n,); the root and all nodes enter the target's cache."""
    root_index = runner.length
    logits = runner.forward(tree.tokens, tree.depths, tree.attention_bias(root_index, runner.dtype), root_index)
    return choice.tree(logits, tree.tokens, tree.ancestors, sequence)


def accept_greedy(tree: DraftTree, target_choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The deepest node whose whole path equals the target's choices: its path (root first) and the bonus token.

    Siblings carry distinct tokens, so at most one node per depth can agree with the target.
    """
    matches = tree.tokens == target_choice[tree.parents.clamp_min(0)]
    matches[0] = True
    valid = ~(tree.ancestors & ~matches[None, :]).any(dim=1)
    best = int((tree.depths * valid).argmax())
    return tree.path_to(best), target_choice[best]
