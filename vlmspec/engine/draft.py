"""Grow a draft tree with the draft model: one draft forward per tree level over its KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policies import TreePlan
from .runner import ModelRunner
from .tree import DraftTree, TreeBuilder, additive_mask


@dataclass
class Drafted:
    """A grown tree, the draft's log-probabilities at the root, and how many tree nodes the draft cache holds.

    `greedy_depth` is how far the draft's own top-1 path reaches in the tree: with the target as its own draft,
    exactly that many tokens are accepted.
    """

    tree: DraftTree
    root_log_probs: torch.Tensor
    cached_nodes: int
    greedy_depth: int


class Drafter:
    """Feeds the pending tokens, then each tree level, to the draft; the plan picks children from its top-k."""

    def __init__(self, runner: ModelRunner, vocab_limit: int):
        self.runner = runner
        self.vocab_limit = vocab_limit
        self.builder = TreeBuilder(0, runner.device)

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits[..., : self.vocab_limit].float(), dim=-1)

    def grow(self, pending: torch.Tensor, plan: TreePlan) -> Drafted:
        """`pending` are the emitted tokens the draft has not seen; the last one is the root of the tree."""
        if plan.max_nodes + 1 > self.builder.capacity or self.builder.tokens.device != self.runner.device:
            self.builder = TreeBuilder(max(plan.max_nodes, self.builder.capacity - 1), self.runner.device)
        runner, builder = self.runner, self.builder
        root_index = runner.length + pending.shape[0] - 1
        depths = torch.arange(-pending.shape[0] + 1, 1, device=runner.device)
        logits = runner.forward(pending, depths, runner.causal_bias(pending.shape[0]), root_index)
        root_log_probs = self._log_probs(logits[-1])
        builder.start(pending[-1])
        frontier = slice(0, 1)
        child_log_probs = root_log_probs[None]
        cached_nodes = 0
        for level in range(1, plan.depth + 1):
            top = child_log_probs.topk(plan.top_k, dim=-1)
            parent_log_probs = builder.log_probs[frontier]
            rows, ranks = plan.children(level, parent_log_probs, top.values, plan.max_nodes - (builder.size - 1))
            if rows.shape[0] == 0:
                break
            new = builder.add_level(
                rows + frontier.start, top.indices[rows, ranks], parent_log_probs[rows] + top.values[rows, ranks], ranks
            )
            if level == plan.depth or builder.size - 1 >= plan.max_nodes:
                break
            frontier = new
            bias = additive_mask(runner.length - cached_nodes, builder.ancestors[new, 1 : new.stop], runner.dtype)
            logits = runner.forward(builder.tokens[new], builder.depths[new], bias, root_index)
            child_log_probs = self._log_probs(logits)
            cached_nodes = new.stop - 1
        return Drafted(builder.build(), root_log_probs, cached_nodes, builder.greedy_depth())
