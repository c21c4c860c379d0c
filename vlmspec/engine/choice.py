"""The target's greedy choice at every tree node, with `generate`'s own logits processors applied.

Processors such as `min_new_tokens` or a repetition penalty read the sequence so far; a tree node's sequence is
the emitted tokens plus its path. Some processors hold per-batch state sized for one sequence, so each node is
processed on its own: exact, and a cost paid only when the generation config asks for processors.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from .tree import DraftTree


class GreedyChoice:
    """argmax of the processed logits, exactly as greedy `generate` picks its next token."""

    def __init__(self, processors: LogitsProcessorList):
        self.processors = processors

    def first(self, logits: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The token after `sequence` (1, T) given its logits (V,)."""
        if self.processors:
            logits = self.processors(sequence, logits[None].clone())[0]
        return logits.argmax(-1)

    def tree(self, logits: torch.Tensor, tree: DraftTree, sequence: torch.Tensor) -> torch.Tensor:
        """The choice after each node (n,), given per-node logits (n, V); `sequence` (1, T) ends with the root."""
        if not self.processors:
            return logits.argmax(-1)
        logits = logits.clone()
        for node in range(tree.size):
            ids = torch.cat([sequence[0], tree.tokens[tree.path_to(node)[1:]]])[None]
            logits[node] = self.processors(ids, logits[node : node + 1])[0]
        return logits.argmax(-1)
