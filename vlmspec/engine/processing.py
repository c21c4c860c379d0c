"""The generation config's logits processing at tree nodes, and the target's choice of path and token.

Processors that read the sequence (repetition penalty, n-gram bans, `min_new_tokens`, ...) see each node's own
sequence: the emitted tokens plus the node's path below the root. Warpers (temperature, top-k, top-p, min-p, ...)
act on each row alone, so they run batched. The draft proposes under the same processing, so that it proposes
what the processed target would choose.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    EncoderRepetitionPenaltyLogitsProcessor,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    LogitNormalization,
    LogitsProcessor,
    MinPLogitsWarper,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopHLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from ..device_tensors import host_values
from .accept import draw

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
    """`generate`'s logits processors split into sequence processors (per node) and row-wise warpers (batched).

    `key` describes the processors' settings: sequences whose processings have equal keys can be processed by either.
    Without `sampling` every processor decides the argmax, warper classes a caller passed included, so none is
    split off. `width`, when set, is how wide the logits the caller's processors expect are (the target's
    vocabulary): narrower ones (the draft's) are widened with -inf to reach them.
    """

    def __init__(self, processors: LogitsProcessorList, row: int = 0, sampling: bool = True, width: int | None = None):
        self._source = processors
        self.sampling = sampling
        self.width = width
        self._per_row = any(_per_row(p) for p in processors)
        processors = LogitsProcessorList(_for_one_sequence(p, row) for p in processors)
        self.key = tuple(_describe(p) for p in processors)
        split = len(processors)
        while sampling and split > 0 and isinstance(processors[split - 1], _ROW_WISE):
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
        if not self.sequence_processors or self.batches_rows or tokens is None or tokens.shape[0] == 1:
            rows_tokens = None if tokens is None or tokens.shape[0] == 1 else tokens[None]
            return self.process_rows(logits[None], sequence, rows_tokens, ancestors)[0]
        return self.process_nodes(logits[None], [sequence], tokens[None], ancestors)[0]

    def process_nodes(
        self,
        logits: torch.Tensor,
        sequences: Sequence[torch.Tensor],
        tokens: torch.Tensor | None = None,
        ancestors: torch.Tensor | None = None,
        depth: int | None = None,
    ) -> torch.Tensor:
        """`process` of B sequences' trees, each sequence of its own length, for processors that read more than a
        set of ids: `logits` (B, m, V), `sequences` B tensors (1, T_b), `tokens` (B, N) over `ancestors` (m, N) or
        (B, m, N) (None: the roots alone). The nodes whose sequences (T_b plus the node's depth) are equally long, in
        every tree, go through one call of the processors, stacked (`generate` calls processors on many rows at
        once too), after one read of the nodes' depths, or none when `depth` says every node is that deep (a draft
        level's)."""
        rows, m, width = logits.shape
        scores = logits.to(dtype=torch.float32, copy=True).reshape(rows * m, width)
        if tokens is None or tokens.shape[1] == 1:
            depths = [[0] * m for _ in range(rows)]
        else:
            path_rows = ancestors[..., 1 : tokens.shape[1]].expand(rows, m, -1)
            # Each node's ancestors below the root in tree order first (stable: ties keep their order).
            order = path_rows.to(torch.uint8).sort(dim=2, descending=True, stable=True).indices
            depths = [[depth] * m for _ in range(rows)] if depth is not None else path_rows.sum(2).tolist()
        groups: dict[int, dict[int, list[int]]] = {}
        for b, row_depths in enumerate(depths):
            for i, node_depth in enumerate(row_depths):
                groups.setdefault(sequences[b].shape[1] + node_depth, {}).setdefault(b, []).append(i)
        for length, members in sorted(groups.items()):
            parts, flat = [], []
            for b, nodes in members.items():
                ids = sequences[b].expand(len(nodes), -1)
                path = length - sequences[b].shape[1]
                if path:
                    chosen = host_values(nodes, tokens.device) if len(nodes) < m else slice(None)
                    ids = torch.cat([ids, tokens[b, 1:][order[b, chosen, :path]]], dim=1)
                parts.append(ids)
                flat += [b * m + i for i in nodes]
            index = slice(None) if len(flat) == rows * m else host_values(flat, scores.device)
            scores[index] = self.sequence_processors(torch.cat(parts) if len(parts) > 1 else parts[0], scores[index])
        return scores.view(rows, m, width)

    def full_scores(self, logits: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """`generate`'s scores (1, V) of the token after `sequence` (1, T): every processor, warpers included, in order
        on float32 `logits` (1, V) (modified in place, as `generate`'s processors may)."""
        scores = self.sequence_processors(sequence, logits)
        for warper in self.warpers:
            scores = warper(sequence, scores)
        return scores

    def for_row(self, row: int) -> NodeProcessing:
        """The processing of row `row` of the padded batch the processors were made for (a repetition penalty that
        skips each row's own padding skips that row's)."""
        return NodeProcessing(self._source, row, self.sampling, self.width) if self._per_row else self

    @property
    def batches_rows(self) -> bool:
        """Whether the sequence processors read the sequence only as a set of ids (or there are none): then many
        sequences, each padded with its own last token, and many nodes go through one call."""
        return self._batched

    def process_rows(
        self,
        logits: torch.Tensor,
        sequences: torch.Tensor | Sequence[torch.Tensor],
        tokens: torch.Tensor | None = None,
        ancestors: torch.Tensor | None = None,
        depth: int | None = None,
    ) -> torch.Tensor:
        """`process` of B sequences' trees at once: `logits` (B, m, V), `sequences` (B, T) (each ending with its
        root, padded to T with its own last token) or B tensors (1, T_b) of their own lengths, `tokens` (B, N) each
        sequence's tree over the one structure `ancestors` (m, N) of the m nodes, or each its own (B, m, N); None
        for the roots alone; `depth`, when every node is that deep. A padded `(B, T)` needs `batches_rows` where
        sequences' lengths differ or the nodes have a tree below them."""
        if not self.sequence_processors:
            return logits.float()
        if not isinstance(sequences, torch.Tensor):
            if len(sequences) > 1:
                return self.process_nodes(logits, sequences, tokens, ancestors, depth)
            sequences = sequences[0]
        if tokens is not None and tokens.shape[1] > 1 and not self.batches_rows:
            if logits.shape[0] != 1:
                raise ValueError("processors that read more of a sequence than its ids take one sequence at a time")
            return self.process_nodes(logits, [sequences], tokens, ancestors, depth)
        rows, m, width = logits.shape
        scores = logits.to(dtype=torch.float32, copy=True).reshape(rows * m, width)
        ids = sequences[:, None, :].expand(rows, m, -1)
        if tokens is not None and tokens.shape[1] > 1:
            path_rows = ancestors[..., 1 : tokens.shape[1]]
            path_rows = path_rows if path_rows.ndim == 3 else path_rows[None]
            padded = torch.where(path_rows, tokens[:, None, 1:], sequences[:, -1, None, None])
            ids = torch.cat([ids, padded], dim=2)
        return self.sequence_processors(ids.reshape(rows * m, -1), scores).view(rows, m, width)

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
        return _spread(scores.softmax(-1), columns, width), None if doubt is None else doubt.any()

    def distribution_rows(
        self, scores: torch.Tensor, sequences: torch.Tensor, compact: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`distribution` of B sequences' nodes at once: `scores` (B, m, V), each sequence's doubt (B,). The warpers
        act on each node alone and read no ids, so one call serves every sequence."""
        rows, m, width = scores.shape
        warped, columns, doubt = self._warp(scores.reshape(rows * m, width), sequences[:1], compact, judge=True)
        probs = _spread(warped.softmax(-1), columns, width)
        return probs.view(rows, m, width), None if doubt is None else doubt.view(rows, m).any(1)

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
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Every warper in order over `scores` (m, V); with `compact`, those after a top-k on its k columns (then
        returned with the scores) and whether each row's top-k kept more than k tokens (m,); with `judge`, also
        whether ties could make a later warper's cut differ from the full row's. Nothing compacted, nothing is in
        doubt (None)."""
        width = scores.shape[1]
        columns = None
        doubt = None
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


def _describe(processor: LogitsProcessor) -> tuple:
    """What a processor does, as a comparable value: its class and settings (tensors by their values, other objects
    by identity), so two sequences' processings that compare equal process any logits alike."""

    def value(v: object) -> object:
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.reshape(-1).tolist()))
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple)):
            return tuple(value(item) for item in v)
        return ("object", id(v))

    return (type(processor), tuple(sorted((k, value(v)) for k, v in vars(processor).items())))


def _compacts(warper: LogitsProcessor, width: int) -> bool:
    """Whether later warpers are worth running on `warper`'s kept columns only: a top-k of at most a quarter."""
    return isinstance(warper, TopKLogitsWarper) and 4 * warper.top_k <= width


def _top_columns(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `k` best columns of each row in vocabulary order, their scores, and whether each row's (k+1)-th score ties
    its k-th (the top-k kept more than k tokens)."""
    top = scores.topk(k + 1, dim=-1)
    overflow = (top.values[:, k] == top.values[:, k - 1]) & torch.isfinite(top.values[:, k])
    columns = top.indices[:, :k].sort(dim=-1).values
    return scores.gather(1, columns), columns, overflow


def _tie_across_cut(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """Whether a warper that keeps the best-scoring tokens (top-p) cut between two equal scores of each row of
    `before` (m,): then which of them it kept depends on how a sort ordered them."""
    kept = torch.isfinite(after)
    removed = torch.isfinite(before) & ~kept
    lowest_kept = before.masked_fill(~kept, torch.inf).amin(dim=-1)
    highest_removed = before.masked_fill(~removed, -torch.inf).amax(dim=-1)
    return lowest_kept == highest_removed


def _ties(scores: torch.Tensor) -> torch.Tensor:
    """Whether two finite scores of each row are equal (m,)."""
    ordered = scores.sort(dim=-1).values
    return ((ordered[:, 1:] == ordered[:, :-1]) & torch.isfinite(ordered[:, 1:])).any(-1)


def _spread(values: torch.Tensor, columns: torch.Tensor | None, width: int) -> torch.Tensor:
    """`values` over `columns` placed back into rows of the full `width` (None: they are full rows)."""
    if columns is None:
        return values
    return values.new_zeros(values.shape[0], width).scatter_(1, columns, values)


def _per_row(processor: LogitsProcessor) -> bool:
    """Whether `processor` holds a value per row of its batch: `generate` gives a repetition penalty each row's
    padding to skip, the encoder-side processors each row's prompt, and `prefix_allowed_tokens_fn` each row's index."""
    if isinstance(processor, RepetitionPenaltyLogitsProcessor):
        return isinstance(getattr(processor, "prompt_ignore_length", None), torch.Tensor)
    return isinstance(
        processor,
        (
            PrefixConstrainedLogitsProcessor,
            EncoderRepetitionPenaltyLogitsProcessor,
            EncoderNoRepeatNGramLogitsProcessor,
        ),
    )


def _for_one_sequence(processor: LogitsProcessor, row: int = 0) -> LogitsProcessor:
    """`processor` made row-count agnostic, for row `row` of its batch: a repetition penalty skips that row's own
    padding (`generate` sizes its ignored prompt to the batch), the encoder-side processors read that row's prompt,
    and `prefix_allowed_tokens_fn` is called with that row's index whatever rows a call carries."""
    if not _per_row(processor):
        return processor
    if isinstance(processor, RepetitionPenaltyLogitsProcessor):
        ignore = processor.prompt_ignore_length.reshape(-1)
        skip = int(ignore[row if ignore.shape[0] > row else 0])
        return RepetitionPenaltyLogitsProcessor(processor.penalty, prompt_ignore_length=skip)
    if isinstance(processor, PrefixConstrainedLogitsProcessor):
        allowed = processor._prefix_allowed_tokens_fn
        return PrefixConstrainedLogitsProcessor(_RowIndexed(allowed, row), 1)
    own = copy.copy(processor)
    if isinstance(processor, EncoderRepetitionPenaltyLogitsProcessor):
        ids = processor.encoder_input_ids
        own.encoder_input_ids = ids[min(row, ids.shape[0] - 1)][None]
    else:
        own.generated_ngrams = [processor.generated_ngrams[min(row, processor.batch_size - 1)]]
        own.batch_size = 1
    return own


class _RowIndexed:
    """`prefix_allowed_tokens_fn` called with row `row`'s batch index, as `generate` calls it for that row."""

    def __init__(self, allowed: Callable[[int, torch.Tensor], list[int]], row: int):
        self.allowed = allowed
        self.row = row

    def __call__(self, batch_id: int, input_ids: torch.Tensor) -> list[int]:
        return self.allowed(self.row, input_ids)


class TargetSampler:
    """The target's token after the root, and the accepted path of a verified tree, as `generate` would pick them.

    Greedy configs take the argmax of the processed scores; sampling configs draw from the warped distribution,
    on trees by recursive rejection (`acceptance.accept_trees`), from `generator` or, as `generate`, the global RNG.
    """

    def __init__(self, processing: NodeProcessing, do_sample: bool, generator: torch.Generator | None = None):
        self.processing = processing
        self.do_sample = do_sample
        self.generator = generator

    def for_row(self, row: int) -> TargetSampler:
        """The sampler of row `row` of the padded batch its processors were made for."""
        processing = self.processing.for_row(row)
        return self if processing is self.processing else TargetSampler(processing, self.do_sample, self.generator)

    def first(self, logits: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The token after `sequence` (1, T) given its logits (V,) (once per call: its doubt is read at once)."""
        scores = self.processing.process(logits[None], sequence)
        if not self.do_sample:
            return scores[0].argmax()
        probs, doubt = self.processing.distribution(scores, sequence)
        if doubt is not None and bool(doubt):
            probs, _ = self.processing.distribution(scores, sequence, compact=False)
        return draw(probs[0], self.generator)


#: Each row's tokens so far: one `(B, T)` tensor (each row padded with its own last token) when the rows share a
#: processing, else a list of each row's `(1, T_b)` (None where nothing reads it).
RowSequences = torch.Tensor | Sequence[torch.Tensor | None]


def uniform_processing(processings: Sequence[NodeProcessing | None]) -> bool:
    """Whether no row processes its logits (so every row's log-probabilities come from one batched operation)."""
    return all(p is None or not (p.sequence_processors or p.warpers) for p in processings)


def common_processing(processings: Sequence[NodeProcessing | None]) -> NodeProcessing | None:
    """The processing every row's equals, when one call can serve all rows (its sequence processors read a sequence
    as a set of ids); None when rows differ or none can."""
    shared = same_processing(processings)
    return shared if shared is not None and shared.batches_rows else None


def batched_processing(
    processings: Sequence[NodeProcessing | None], sequences: RowSequences
) -> tuple[NodeProcessing | None, torch.Tensor | None] | None:
    """The processing all rows share and their `(B, T)` tokens so far it reads, where one call of tensors serves every
    row: `(None, None)` where no row processes its logits; None where rows differ, their processors read more of a
    sequence than its ids, or their tokens are not one tensor (a batch of one's own sequence counts as one)."""
    if uniform_processing(processings):
        return None, None
    shared = common_processing(processings)
    if isinstance(sequences, (list, tuple)) and len(sequences) == 1:
        sequences = sequences[0]
    if shared is None or not isinstance(sequences, torch.Tensor):
        return None
    return shared, sequences


def same_processing(processings: Sequence[NodeProcessing | None]) -> NodeProcessing | None:
    """The processing every row's equals (one call may then serve nodes of many rows whose sequences are equally
    long, `NodeProcessing.process_nodes`); None when rows differ."""
    first = processings[0]
    if first is None or not all(p is first or (p is not None and p.key == first.key) for p in processings):
        return None
    return first
