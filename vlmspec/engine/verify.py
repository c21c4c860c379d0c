"""Verification: one target forward over the whole tree, every node seeing only its own path."""

from __future__ import annotations

import torch

from .runner import ModelRunner
from .tree import DraftTree


def verify_tree(runner: ModelRunner, tree: DraftTree) -> torch.Tensor:
    """The target's logits after every node (n, V); the root and all nodes enter the target's cache."""
    root_index = runner.length
    return runner.forward(tree.tokens, tree.depths, tree.attention_bias(runner.dtype), root_index)
