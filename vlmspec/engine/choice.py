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
#: Warpers whose cut depends on a sort of something other than the scores, so any tie may matter.
_SORTS_OTHERWISE = (TypicalLogitsWarper, TopHLogitsWarper)
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

    def distribution(
        self, scores: torch.Tensor, sequence: torch.Tensor, compact: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The warped distribution (m, V) `generate` samples from, given processed `scores` (m, V), and whether it is
        in doubt (a () bool on the device; read it with the step's results).

        With `compact`, warpers after a top-k of k see only its k best columns (the cut tokens are -inf and no later
        warper revives one), so top-p, typical-p and the like sort k values, not the vocabulary. That is `generate`'s
        distribution unless ties could make it differ: the top-k kept more than k tokens (ties at its k-th value),
        top-p cut between two equal scores, or typical-p or top-h sorted equal values (a sort does not order them as
        the full row's sort does). Then the doubt flag is set, and the caller draws afresh from the full rows
        (`compact=False`). Fixed shapes: nothing here waits for the device.
        """
        width = scores.shape[1]
        scores, columns, doubt = self._warp(scores, sequence, compact, judge=True)
        return _spread(scores.softmax(-1), columns, width), doubt

    def log_probs(self, scores: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (m, V) of processed `scores` under the warpers: -inf where they cut a token.

        For the draft's proposals: after a top-k, later warpers see its k best columns, ties or not (a proposal
        only has to be likely, not exact).
        """
        width = scores.shape[1]
        scores, columns, _ = self._warp(scores, sequence, compact=True, judge=False)
        log_probs = torch.log_softmax(scores, dim=-1)
        if columns is None:
            return log_probs
        return log_probs.new_full((log_probs.shape[0], width), -torch.inf).scatter_(1, columns, log_probs)

    def _warp(
        self, scores: torch.Tensor, sequence: torch.Tensor, compact: bool, judge: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Every warper in order over `scores` (m, V); with `compact`, those after a top-k on its k columns (then
        returned with the scores) and whether the top-k kept more than k tokens; with `judge`, also whether ties could
        make a later warper's cut differ from the full rows'."""
        width = scores.shape[1]
        columns = None
        doubt = torch.zeros((), dtype=torch.bool, device=scores.device)
        for warper in self.warpers:
            before = scores
            scores = warper(sequence.expand(scores.shape[0], -1), scores)
            if compact and columns is None and _compacts(warper, width):
                scores, columns, doubt = _top_columns(scores, warper.top_k)
            elif judge and columns is not None and isinstance(warper, TopPLogitsWarper):
                doubt = doubt | _tie_across_cut(before, scores)
            elif judge and columns is not None and isinstance(warper, _SORTS_OTHERWISE):
                doubt = doubt | _ties(before)
        return scores, columns, doubt


def _compacts(warper: LogitsProcessor, width: int) -> bool:
    """Whether later warpers are worth running on `warper`'s kept columns only: a top-k of at most a quarter."""
    return isinstance(warper, TopKLogitsWarper) and 4 * warper.top_k <= width


def _top_columns(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `k` best columns of each row in vocabulary order, their scores, and whether the (k+1)-th score ties the
    k-th (the top-k kept more than k tokens)."""
    top = scores.topk(k + 1, dim=-1)
    overflow = (top.values[:, k] == top.values[:, k - 1]) & torch.isfinite(top.values[:, k])
    columns = top.indices[:, :k].sort(dim=-1).values
    return scores.gather(1, columns), columns, overflow.any()


def _tie_across_cut(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Whether a warper that keeps the best-scoring tokens (top-p) cut between two equal scores of `before`: then
    which of them it kept depends on how a sort ordered them."""
    kept = torch.isfinite(after)
    removed = torch.isfinite(before) & ~kept
    lowest_kept = before.masked_fill(~kept, torch.inf).amin(dim=-1)
    highest_removed = before.masked_fill(~removed, -torch.inf).amax(dim=-1)
    return (lowest_kept == highest_removed).any()


def _ties(scores: torch.Tensor) -> torch.Tensor:
    """Whether two finite scores of a row are equal."""
    ordered = scores.sort(dim=-1).values
    return ((ordered[:, 1:] == ordered[:, :-1]) & torch.isfinite(ordered[:, 1:])).any()


def _spread(values: torch.Tensor, columns: torch.Tensor | None, width: int) -> torch.Tensor:
    """`values` over `columns` placed back into rows of the full `width` (None: they are full rows)."""
    if columns is None:
        return values
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
        """The token after `sequence` (1, T) given its logits (V,) (once per call: its doubt is read at once)."""
        scores = self.processing.process(logits[None], sequence)
        if not self.do_sample:
            return scores[0].argmax()
        probs, doubt = self.processing.distribution(scores, sequence)
        if bool(doubt):
            probs, _ = self.processing.distribution(scores, sequence, compact=False)
        return draw(probs[0], self.generator)

    def accept(self, tree: DraftTree, logits: torch.Tensor, sequence: torch.Tensor, compact: bool = True) -> Verdict:
        """The accepted path and the bonus token, from the target's logits after each node, left on the device.

        `logits` (n, V) are the target's after every node; `sequence` (1, T) ends with the root. A sampled verdict
        carries the distribution's doubt; when it is set, accepting again with `compact=False` draws afresh from
        the full rows. The redraw is exact: whether it happens depends on the logits alone, not on the draws.
        """
        processing = self.processing
        scores = processing.process(logits, sequence, tree.tokens, tree.ancestors)
        if not self.do_sample:
            return accept_greedy(tree, scores.argmax(-1))
        probs, doubt = processing.distribution(scores, sequence, compact)
        verdict = accept_sampled(tree, probs, self.generator)
        verdict.doubt = doubt
        return verdict
