"""Grow a draft tree with the draft model: one draft forward per tree level over its KV cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..policies import TreePlan
from .choice import NodeProcessing
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
    """Feeds the pending tokens, then each tree level, to the draft; the plan picks children from its top-k.

    The draft proposes only ids below `vocab_limit` (real tokens of both models, not head padding). Emitted tokens
    the draft cannot embed (the target's padding rows) are fed as its last embedding row: that costs the draft's
    accuracy, never the output's exactness.
    """

    def __init__(self, runner: ModelRunner, vocab_limit: int, input_limit: int):
        self.runner = runner
        self.vocab_limit = vocab_limit
        self.input_limit = input_limit
        self.builder = TreeBuilder(0, runner.device)

    def _log_probs(
        self,
        logits: torch.Tensor,
        processing: NodeProcessing | None,
        sequence: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Log-probabilities of the real tokens after the generation config's sequence processors.

        `rows` are the ancestor rows of the nodes `logits` belong to (None: the root).
        """
        logits = logits[..., : self.vocab_limit]
        if processing is None:
            return torch.log_softmax(logits.float(), dim=-1)
        builder = self.builder
        tokens = None if rows is None else builder.tokens[: builder.size]
        scores = processing.process(logits.reshape(-1, logits.shape[-1]), sequence, tokens, rows)
        return torch.log_softmax(scores, dim=-1).reshape(logits.shape)

    def grow(
        self,
        pending: torch.Tensor,
        plan: TreePlan,
        sequence: torch.Tensor,
        processing: NodeProcessing | None = None,
    ) -> Drafted:
        """`pending` are the emitted tokens the draft has not seen; the last one is the root of the tree.

        `sequence` (1, T) is everything emitted so far, ending with the root; `processing` the config's processors.
        """
        if plan.max_nodes + 1 > self.builder.capacity or self.builder.tokens.device != self.runner.device:
            self.builder = TreeBuilder(max(plan.max_nodes, self.builder.capacity - 1), self.runner.device)
        runner, builder = self.runner, self.builder
        root = pending[-1]
        pending = pending.clamp_max(self.input_limit - 1)
        if processing is not None:
            sequence = sequence.to(runner.device).clamp_max(self.vocab_limit - 1)
        root_index = runner.length + pending.shape[0] - 1
        depths = torch.arange(-pending.shape[0] + 1, 1, device=runner.device)
        logits = runner.forward(pending, depths, runner.causal_bias(pending.shape[0]), root_index)
        builder.start(root)
        root_log_probs = self._log_probs(logits[-1], processing, sequence)
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
            child_log_probs = self._log_probs(logits, processing, sequence, builder.ancestors[new, : builder.size])
            cached_nodes = new.stop - 1
        return Drafted(builder.build(), root_log_probs, cached_nodes, builder.greedy_depth())
