"""The generation config's logits processing at tree nodes, and the target's choice of path and token.

Processors that read the sequence (repetition penalty, n-gram bans, `min_new_tokens`, ...) see each node's own
sequence: the emitted tokens plus the node's path below the root. Warpers (temperature, top-k, top-p, min-p, ...)
act on each row alone, so they run batched. The draft proposes under the same processing, so that it proposes
what the processed target would choose.
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

from .accept import Verdict, accept_greedy, accept_sampled, draw
from .tree import DraftTree

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

    def distribution(self, scores: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The warped distribution (m, V) `generate` samples from, given processed `scores` (m, V).

        Warpers run one after another on the rows that still keep more than one token; a row they narrow to one
        token is settled as one-hot (no later warper widens it), so a top-k of 1 costs one top-k and nothing more.
        """
        probs = torch.zeros_like(scores)
        rows = torch.arange(scores.shape[0], device=scores.device)
        columns = None
        for warper in self.warpers:
            scores, columns = self._warp(warper, scores, sequence, columns)
            kept = torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min)
            single = kept.sum(-1) == 1
            if bool(single.any()):
                probs[rows[single]] = _spread(kept[single].to(probs.dtype), columns, single, probs.shape[1])
                rows, scores = rows[~single], scores[~single]
                columns = None if columns is None else columns[~single]
                if rows.shape[0] == 0:
                    return probs
        probs[rows] = _spread(scores.softmax(-1), columns, None, probs.shape[1])
        return probs

    def log_probs(self, scores: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (m, V) of processed `scores` under the warpers: -inf where they cut a token."""
        width = scores.shape[1]
        columns = None
        for warper in self.warpers:
            scores, columns = self._warp(warper, scores, sequence, columns)
        log_probs = torch.log_softmax(scores, dim=-1)
        if columns is None:
            return log_probs
        return log_probs.new_full((log_probs.shape[0], width), -torch.inf).scatter_(1, columns, log_probs)

    @staticmethod
    def _warp(
        warper: LogitsProcessor, scores: torch.Tensor, sequence: torch.Tensor, columns: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One warper over `scores` (m, k) on vocabulary `columns` (None: all); after a top-k, only its columns."""
        scores = warper(sequence.expand(scores.shape[0], -1), scores)
        if columns is None and isinstance(warper, TopKLogitsWarper):
            return _kept_columns(scores)
        return scores, columns


def _kept_columns(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The columns a top-k kept (ties at the k-th value included), in vocabulary order, and their indices.

    The cut tokens are -inf, which no later warper revives, so top-p, typical-p and the like sort k values
    instead of the whole vocabulary. Sorting is not stable, so where kept scores tie, the rows stay whole: only the
    full row sorts as `generate` sorts it.
    """
    kept = torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min)
    width = int(kept.sum(-1).max())
    if 4 * width > scores.shape[1]:
        return scores, None
    columns = scores.topk(width, dim=-1).indices.sort(dim=-1).values
    compact = scores.gather(1, columns)
    ordered = compact.sort(dim=-1).values
    if bool(((ordered[:, 1:] == ordered[:, :-1]) & torch.isfinite(ordered[:, 1:])).any()):
        return scores, None
    return compact, columns


def _spread(values: torch.Tensor, columns: torch.Tensor | None, rows: torch.Tensor | None, width: int) -> torch.Tensor:
    """`values` over `columns` (of the `rows` selected) placed back into rows of the full `width`."""
    if columns is None:
        return values
    if rows is not None:
        columns = columns[rows]
    return values.new_zeros(values.shape[0], width).scatter_(1, columns, values)


def _for_one_sequence(processor: LogitsProcessor) -> LogitsProcessor:
    """`processor` made row-count agnostic: generate sizes a repetition penalty's ignored prompt to its batch."""
    ignore = getattr(processor, "prompt_ignore_length", None)
    if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(ignore, torch.Tensor):
        return RepetitionPenaltyLogitsProcessor(processor.penalty, prompt_ignore_length=int(ignore.reshape(-1)[0]))
    return processor


class TargetSampler:
    """The target's token after the root, and the accepted path of a verified tree, as `generate` would pick them.

    Greedy configs take the argmax of the processed scores; sampling configs draw from the warped distribution,
    on a tree by recursive rejection (`accept_sampled`), from `generator` or, as `generate`, the global RNG.
    """

    def __init__(self, processing: NodeProcessing, do_sample: bool, generator: torch.Generator | None = None):
        self.processing = processing
        self.do_sample = do_sample
        self.generator = generator

    def first(self, logits: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The token after `sequence` (1, T) given its logits (V,)."""
        scores = self.processing.process(logits[None], sequence)
        if not self.do_sample:
            return scores[0].argmax()
        return draw(self.processing.distribution(scores, sequence)[0], self.generator)

    def accept(self, tree: DraftTree, logits: torch.Tensor, sequence: torch.Tensor) -> Verdict:
        """The accepted path and the bonus token, from the target's logits after each node, left on the device.

        `logits` (n, V) are the target's after every node; `sequence` (1, T) ends with the root.
        """
        processing = self.processing
        scores = processing.process(logits, sequence, tree.tokens, tree.ancestors)
        if not self.do_sample:
            return accept_greedy(tree, scores.argmax(-1))
        return accept_sampled(tree, processing.distribution(scores, sequence), self.generator)
