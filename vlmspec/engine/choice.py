"""The generation config's logits processing at tree nodes, and the target's token after each node.

Processors that read the sequence (repetition penalty, n-gram bans, `min_new_tokens`, ...) see each node's own
sequence: the emitted tokens plus the node's path below the root. Warpers (temperature, top-k, top-p, min-p, ...)
act on each row alone, so they run batched. The draft's proposals go through the same sequence processors, so
that it proposes what the processed target would choose.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitNormalization,
    LogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

_ROW_WISE = (
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    MinPLogitsWarper,
    TypicalLogitsWarper,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitNormalization,
)
# Processors that read the sequence only as a set of token ids: rows padded with a token already in the sequence
# give the same result, so all nodes go through one batched call.
_SET_BASED = (RepetitionPenaltyLogitsProcessor,)


class NodeProcessing:
    """`generate`'s logits processors split into sequence processors (per node) and row-wise warpers (batched)."""

    def __init__(self, processors: LogitsProcessorList):
        processors = LogitsProcessorList(_for_one_sequence(p) for p in processors)
        split = len(processors)
        while split > 0 and isinstance(processors[split - 1], _ROW_WISE):
            split -= 1
        self.sequence_processors = LogitsProcessorList(processors[:split])
        self.warpers = LogitsProcessorList(processors[split:])
        self._batched = all(isinstance(p, _SET_BASED) for p in self.sequence_processors)

    def process(
        self,
        logits: torch.Tensor,
        sequence: torch.Tensor,
        tokens: torch.Tensor | None = None,
        ancestors: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Float32 scores (m, V) of `logits` (m, V) after the sequence processors.

        Row i belongs to a tree node whose ancestor row over the tree's `tokens` (root first) is `ancestors[i]`;
        `sequence` (1, T) ends with the root. Without a tree, every row follows `sequence` itself.
        """
        if not self.sequence_processors:
            return logits.float()
        scores = logits.to(dtype=torch.float32, copy=True)
        m = scores.shape[0]
        if tokens is None or tokens.shape[0] == 1:
            return self.sequence_processors(sequence.expand(m, -1), scores)
        below_root = tokens[1:]
        path_rows = ancestors[:, 1 : tokens.shape[0]]
        if self._batched:
            padded = torch.where(path_rows, below_root[None], sequence[0, -1])
            return self.sequence_processors(torch.cat([sequence.expand(m, -1), padded], dim=1), scores)
        for i in range(m):
            ids = torch.cat([sequence[0], below_root[path_rows[i]]])[None]
            scores[i : i + 1] = self.sequence_processors(ids, scores[i : i + 1])
        return scores

    def pick(self, scores: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The token `generate` picks from processed `scores` (m, V): argmax, or a draw from the warped distribution.

        Warpers run one after another on the rows that still keep more than one token; a row they narrow to one
        token is settled (no later warper widens it), so a top-k of 1 costs one top-k and nothing more.
        """
        if not self.warpers:
            return scores.argmax(-1)
        chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
        rows = torch.arange(scores.shape[0], device=scores.device)
        for warper in self.warpers:
            scores = warper(sequence.expand(rows.shape[0], -1), scores)
            kept = torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min)
            single = kept.sum(-1) == 1
            if bool(single.any()):
                chosen[rows[single]] = kept[single].int().argmax(-1)
                rows, scores = rows[~single], scores[~single]
                if rows.shape[0] == 0:
                    return chosen
        chosen[rows] = torch.multinomial(scores.softmax(-1), num_samples=1).squeeze(1)
        return chosen


def _for_one_sequence(processor: LogitsProcessor) -> LogitsProcessor:
    """`processor` made row-count agnostic: generate sizes a repetition penalty's ignored prompt to its batch."""
    ignore = getattr(processor, "prompt_ignore_length", None)
    if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(ignore, torch.Tensor):
        return RepetitionPenaltyLogitsProcessor(processor.penalty, prompt_ignore_length=int(ignore.reshape(-1)[0]))
    return processor


class TargetChoice:
    """The target's next token after the root and after every tree node, as `generate` would pick it there."""

    def __init__(self, processing: NodeProcessing):
        self.processing = processing

    def first(self, logits: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The token after `sequence` (1, T) given its logits (V,)."""
        processing = self.processing
        return processing.pick(processing.process(logits[None], sequence), sequence)[0]

    def tree(
        self, logits: torch.Tensor, tokens: torch.Tensor, ancestors: torch.Tensor, sequence: torch.Tensor
    ) -> torch.Tensor:
        """The choice after each node (n,), given per-node logits (n, V); `sequence` (1, T) ends with the root."""
        processing = self.processing
        return processing.pick(processing.process(logits, sequence, tokens, ancestors), sequence)
