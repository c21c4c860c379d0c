"""The sequences a batch decodes: each one's request, its row while in flight and its result, and the rows in flight
as one explicit state, what every step reads of all rows at once, held as tensors.

`RowsInFlight` is made when rows join or leave the batch (never patched by matching objects) and carried from step to
step: the tokens each row's draft has not seen `(B, P)` with their counts, the rows' EOS ids `(B, E)`, their stop-string
windows, their tokens so far `(B, T)` where the logits processors need them, and whether the batch decodes alone.
Each step moves it on explicitly: the commit hands it the new pending tokens, plain steps' tokens are put after the
pending ones before the next drafting step, and the emitted tokens advance the windows and the history.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..device_tensors import host_values
from ..policies import TreePolicy
from .prefix import Continuation
from .sequence import DecodeSettings, TokenSink
from .stats import SpecStats
from .stopping import StringCheck, string_check


@dataclass
class RowRequest:
    """One sequence to decode: its own (unpadded) inputs for each model, the ids its output starts with (`prompt`
    (1, P): a padded batch's row keeps its padding there) and how to decode it. `key` names it in the results;
    `streamer` (transformers' streamer protocol) follows its tokens as they are emitted; setting `cancel` (from any
    thread) frees its row at the next step. With a `continuation` the sequence goes on from what the models already
    hold of its inputs' first tokens (a conversation's earlier turns)."""

    key: Any
    target_inputs: dict[str, Any]
    draft_inputs: dict[str, Any]
    prompt: torch.Tensor
    settings: DecodeSettings | None
    error: Exception | None = None
    streamer: Any = None
    cancel: threading.Event | None = None
    continuation: Continuation | None = None

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    @property
    def positions(self) -> int:
        """The most positions its sequence can reach (prompt and token budget): the prompt is as long as its ids, or
        as the target's inputs where the output leaves them out (embeddings given alone)."""
        ids = self.target_inputs.get("input_ids")
        prompt = max(self.prompt.shape[1], 0 if ids is None else ids.shape[1])
        return prompt + self.settings.max_new_tokens


@dataclass
class RowResult:
    """A finished sequence: `sequence` (1, P + n) is the prompt then its new tokens, `stats` its own statistics; or
    the `error` it failed with (then both are None). `scores` and `logits` hold, when its settings ask for them, the
    target's processed scores and raw logits (1, V) that chose each new token, as `generate` returns them; `cache`
    what its models hold of it at its end (all but its last token), to go on from."""

    key: Any
    sequence: torch.Tensor | None
    stats: SpecStats | None
    error: Exception | None = None
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None
    cache: Continuation | None = None


class Row:
    """A sequence in flight: its request, emitted tokens, policy state and the tokens the draft has not seen yet:
    `pending` on the device, then `missed` on the host (emitted by plain steps, fed when it next drafts)."""

    def __init__(self, request: RowRequest, policy: TreePolicy, streaming: bool = True):
        self.request = request
        self.settings = request.settings
        self.sink = TokenSink(request.prompt, request.settings, request.streamer if streaming else None)
        self.policy = policy
        verification = request.settings.verification
        self.stats = SpecStats(verification="exact" if verification is None else verification.label)
        self.started = time.perf_counter()
        self.pending: torch.Tensor | None = None
        self.missed: list[int] = []
        #: A draft head's features of the tokens before the pending ones (P, F), then of the missed ones.
        self.pending_features: torch.Tensor | None = None
        self.missed_features: list[torch.Tensor] = []
        self.cache: Continuation | None = None
        #: The draft's cache entries that hold the prompt (fewer than its tokens where pruning cut it).
        self.draft_prompt = 0

    @property
    def positions(self) -> int:
        """The most positions its sequence can reach (prompt and token budget)."""
        return self.request.positions

    @property
    def own_tokens(self) -> int:
        """The tokens of its own sequence so far, the target's inputs and the new tokens, padding aside."""
        return self.request.target_inputs["input_ids"].shape[1] + self.sink.new_tokens

    def start_pending(self, first: torch.Tensor, features: torch.Tensor | None, device: torch.device) -> None:
        """The first token the draft is fed, after its prompt, with the target's feature of the last prompt token
        where a head drafts (`features` (L, F) of the prompt; None otherwise)."""
        self.pending = first[None].to(device)
        self.pending_features = None if features is None else features[-1:].to(device)

    def miss(self, tokens: list[int], features: torch.Tensor | None) -> None:
        """Tokens a plain step emitted, which the draft is fed when it next drafts, with the target's features of the
        tokens before them `(n, F)` where a head drafts."""
        self.missed += tokens
        if features is not None and tokens:
            self.missed_features.append(features[: len(tokens)])

    def catch_up(self, device: torch.device) -> bool:
        """Put the tokens plain steps emitted after the draft's `pending` ones, to be fed at its next forward; says
        whether there were any."""
        if not self.missed:
            return False
        self.pending = torch.cat([self.pending, host_values(self.missed, device)])
        if self.pending_features is not None:
            features = [f.to(device) for f in self.missed_features]
            self.pending_features = torch.cat([self.pending_features, *features])
        self.missed, self.missed_features = [], []
        return True

    def result(self) -> RowResult:
        self.sink.close()
        self.stats.new_tokens = self.sink.new_tokens
        self.stats.finish(time.perf_counter() - self.started)
        sink = self.sink
        scores = None if sink.scores is None else tuple(sink.scores)
        logits = None if sink.logits is None else tuple(sink.logits)
        return RowResult(self.request.key, sink.sequence, self.stats, scores=scores, logits=logits, cache=self.cache)


@dataclass
class TokenHistory:
    """Every row's tokens so far in one `buffer` (B, capacity) on the device, for logits processors that serve all
    rows in one call: made from the rows' sinks, then each step's emitted tokens are written for all rows at once (the
    sinks keep theirs on the host meanwhile). `lengths[b]` is row b's length."""

    buffer: torch.Tensor
    lengths: list[int]

    @classmethod
    def of(cls, rows: list[Row], device: torch.device) -> TokenHistory:
        """The rows' sequences from their sinks, with room for each to reach its last position."""
        own = [row.sink.sequence[0].to(device) for row in rows]
        capacity = max(row.positions for row in rows) + 1
        buffer = torch.nn.utils.rnn.pad_sequence(own, batch_first=True)
        return cls(torch.nn.functional.pad(buffer, (0, capacity - buffer.shape[1])), [s.shape[0] for s in own])

    def sequences(self) -> torch.Tensor:
        """`(B, T)`: each row's tokens, padded to the longest with its own last token."""
        buffer, width = self.buffer, max(self.lengths)
        lengths = host_values(self.lengths, buffer.device)[:, None]
        columns = torch.arange(width, device=buffer.device)[None]
        last = buffer.gather(1, lengths - 1)
        return torch.where(columns < lengths, buffer[:, :width], last)

    def take(self, tokens: torch.Tensor, counts: list[int]) -> None:
        """Append each row's first `counts[b]` of `tokens` (B, k), all rows in one write."""
        buffer = self.buffer
        starts = host_values(self.lengths, buffer.device)[:, None]
        columns = (starts + torch.arange(tokens.shape[1], device=buffer.device)).clamp_max(buffer.shape[1] - 1)
        buffer.scatter_(1, columns, tokens.to(buffer.device))
        self.lengths = [length + count for length, count in zip(self.lengths, counts, strict=True)]


@dataclass
class RowsInFlight:
    """The rows a step decodes and what it reads of them as tensors. `eos` (B, E) holds each row's EOS ids padded
    with -1; `strings` each row's stop-string windows (None: no row has stop strings); `pending` (B, P) the tokens
    each row's draft has not seen, left-aligned, first `counts[b]` of row b (None until a drafting step gathers them
    from the rows), and where a head drafts the target's features of the tokens before them (B, P, F); `history`
    the rows' tokens so far where the step keeps them on the device (None elsewhere);
    `alone` whether each sequence decodes alone (a batch of one), so that it plans as one sequence does."""

    rows: list[Row]
    alone: bool
    eos: torch.Tensor
    strings: StringCheck | None
    pending: torch.Tensor | None = None
    counts: list[int] | None = None
    history: TokenHistory | None = None
    features: torch.Tensor | None = None

    @classmethod
    def of(cls, rows: list[Row], alone: bool, device: torch.device) -> RowsInFlight:
        """The state of `rows` as they joined or stayed, its EOS ids and stop-string windows on `device` (the
        target's, where the step's acceptance runs)."""
        ids = [row.settings.eos_token_ids.to(device) for row in rows]
        eos = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=-1)
        return cls(list(rows), alone, eos, string_check([row.sink for row in rows], device))

    def drafting(self, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """The `(B, P)` pending tokens on `device` and their counts, for a step in which rows draft: first the tokens
        plain steps emitted are put after each row's pending ones (then every row's are gathered anew)."""
        caught = [row.catch_up(device) for row in self.rows]
        if self.pending is None or any(caught):
            self.counts = [row.pending.shape[0] for row in self.rows]
            self.pending = torch.nn.utils.rnn.pad_sequence([row.pending.to(device) for row in self.rows], True)
            own = [row.pending_features for row in self.rows]
            self.features = None if own[0] is None else torch.nn.utils.rnn.pad_sequence(own, True)
        return self.pending, self.counts

    def committed(self, pending: torch.Tensor, counts: list[int], features: torch.Tensor | None = None) -> None:
        """Take a commit's pending tokens (B, P), first `counts[b]` of row b, and a head's features of the tokens
        before them (B, P, F): each row holds its views of them."""
        for b, row in enumerate(self.rows):
            row.pending = pending[b, : counts[b]]
            row.pending_features = None if features is None else features[b, : counts[b]]
        self.pending, self.counts, self.features = pending, counts, features

    def sequences(self, device: torch.device) -> torch.Tensor:
        """`(B, T)` the rows' tokens so far on `device`, kept there from now on (`advance`)."""
        if self.history is None:
            self.history = TokenHistory.of(self.rows, device)
        return self.history.sequences()

    def forget_history(self) -> None:
        """Keep the rows' tokens in their sinks alone (the step does not keep them on the device)."""
        self.history = None

    def advance(self, tokens: torch.Tensor, counts: list[int]) -> None:
        """After a step: each row's first `counts[b]` of its emitted `tokens` (B, k) join its stop-string window and,
        where it is kept, its history."""
        if self.history is not None:
            self.history.take(tokens, counts)
        if self.strings is not None:
            self.strings.advance(tokens, counts)
