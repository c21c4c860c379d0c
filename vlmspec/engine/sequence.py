"""One sequence being decoded: what stops and shapes it (`DecodeSettings`) and where its tokens go (`TokenSink`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..device_tensors import host_values
from .acceptance import StepReport
from .processing import NodeProcessing, TargetSampler
from .relaxed import RelaxedVerification
from .stopping import Stopping, first_stop


@dataclass
class DecodeSettings:
    """What stops and shapes decoding: the token budget, EOS ids, the target's sampler and the draft's processing.

    `draft_processing` holds the config's processors (repetition penalty, ..., and the warpers when the target
    samples) for the draft's proposals, so it proposes what the processed target chooses; None when there are none.
    `num_sequences` continuations are drawn from one prefill; shorter ones are padded with `pad_token_id`.
    `stopping` holds the criteria besides EOS and the budget; `output_scores`/`output_logits` keep, for each emitted
    token, the target's processed scores and raw logits at the position that chose it, as `generate` returns them
    (with `return_dict_in_generate`), and `return_cache` what the models hold of it at its end, to go on from.
    `verification` is None for the target's own output, or the relaxed rule its tokens are accepted by (lossy,
    greedy only: `RelaxedVerification`).
    """

    max_new_tokens: int
    eos_token_ids: torch.Tensor
    sampler: TargetSampler
    draft_processing: NodeProcessing | None = None
    num_sequences: int = 1
    pad_token_id: int | None = None
    stopping: Stopping = field(default_factory=Stopping)
    output_scores: bool = False
    output_logits: bool = False
    return_dict_in_generate: bool = False
    return_cache: bool = False
    verification: RelaxedVerification | None = None

    @property
    def records(self) -> bool:
        """Whether emitted tokens' scores or logits are kept."""
        return self.output_scores or self.output_logits

    @property
    def judged_on_host(self) -> bool:
        """Whether each step's emitted tokens pass through the host before the sink takes them (outputs to keep, a
        time limit or Python stopping criteria)."""
        return self.records or self.stopping.on_host

    def for_row(self, row: int) -> DecodeSettings:
        """The settings of row `row` of the padded batch they were resolved for (processors that hold a value per
        row take that row's)."""
        sampler = self.sampler.for_row(row)
        if sampler is self.sampler:
            return self
        processing = None if self.draft_processing is None else self.draft_processing.for_row(row)
        return replace(self, sampler=sampler, draft_processing=processing)


@dataclass
class Judged:
    """A step's emitted tokens as the host judged them before reading: `stop` when the time limit ends the sequence
    after its first token, the Python criteria's `answers` (count,) on the device, and the `scores` and `logits`
    (1, V) of each token."""

    stop: int | None
    answers: torch.Tensor | None
    scores: list[torch.Tensor]
    logits: list[torch.Tensor]


class TokenSink:
    """Collects emitted tokens after the prompt, cuts at EOS and at the budget, and feeds a streamer.

    Tokens taken `on_device=False` are kept as the host's copy of the step's read and written to the device in one
    copy when the sequence is next asked for: a batch whose rows' sequences nothing reads during decoding (no logits
    processors) writes each row's tokens once, at its end, not once per step.
    """

    def __init__(self, prompt: torch.Tensor, settings: DecodeSettings, streamer: Any):
        self.settings = settings
        self.streamer = streamer
        self.buffer = torch.empty(1, prompt.shape[1] + settings.max_new_tokens, dtype=torch.long, device=prompt.device)
        self.buffer[:, : prompt.shape[1]] = prompt
        self.length = prompt.shape[1]
        self.prompt_length = prompt.shape[1]
        self.finished = settings.max_new_tokens <= 0
        # The last token emitted (on the host), what a plain step feeds the target next; `emit` sets the first.
        self.last_token = 0
        self._host: list[int] = []
        self.scores: list[torch.Tensor] | None = [] if settings.output_scores else None
        self.logits: list[torch.Tensor] | None = [] if settings.output_logits else None
        if streamer is not None:
            streamer.put(prompt.cpu())

    @property
    def sequence(self) -> torch.Tensor:
        self._write_host()
        return self.buffer[:, : self.length]

    def _write_host(self) -> None:
        """Write the tokens kept on the host into the device's buffer."""
        if self._host:
            start = self.length - len(self._host)
            self.buffer[0, start : self.length] = host_values(self._host, self.buffer.device)
            self._host = []

    @property
    def new_tokens(self) -> int:
        return self.length - self.prompt_length

    @property
    def room(self) -> int:
        """Tokens the budget still allows."""
        return self.settings.max_new_tokens - self.new_tokens

    def take(self, tokens: torch.Tensor, report: StepReport, on_device: bool = True) -> None:
        """Append the first `report.count` of a step's `tokens` (on the device), as its report settled them: copied
        on the device, or (`on_device=False`) kept from the report's host copy until the sequence is asked for."""
        if on_device:
            self._write_host()
            self.buffer[0, self.length : self.length + report.count] = tokens[: report.count]
        else:
            self._host += report.tokens[: report.count]
        self.length += report.count
        if report.count:
            self.last_token = report.tokens[report.count - 1]
        self.finished = report.finished
        if self.streamer is not None and report.count:
            self.streamer.put(torch.tensor(report.tokens[: report.count]))

    def judge(self, tokens: torch.Tensor, count: int, logits: torch.Tensor | None) -> Judged:
        """The scores and logits of the first `count` of a step's emitted `tokens` (k,) (`logits` (count, V): the
        target's at the positions that chose them; None when none are kept) and the host's stopping criteria's
        answers after each, unread; `settle` keeps them once the answers are read."""
        deadline = self.settings.stopping.past_deadline()
        if deadline:
            count = min(count, 1)
        before = self.sequence[0]
        scores: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        if logits is not None:
            processing = self.settings.sampler.processing
            for j in range(count):
                row = logits[j : j + 1].to(dtype=torch.float32, copy=True)
                raw.append(row)
                if self.scores is not None:
                    ids = torch.cat([before, tokens[:j]])[None]
                    scores.append(processing.full_scores(row.clone(), ids))
        kept = None if self.scores is None else self.scores + scores

        def scores_up_to(j: int) -> tuple[torch.Tensor, ...] | None:
            return None if kept is None else tuple(kept[: len(self.scores) + j])

        answers = None if deadline else self.settings.stopping.answers(before, tokens, count, scores_up_to)
        return Judged(1 if deadline else None, answers, scores, raw)

    def settle(self, judged: Judged, answers: list[bool]) -> int | None:
        """Keep what `judge` found up to where the sequence stops, given its criteria's `answers` as read; returns
        how many tokens are emitted when it stops there, else None."""
        stop = judged.stop if judged.stop is not None else first_stop(answers)
        if self.scores is not None:
            self.scores += judged.scores[:stop]
        if self.logits is not None:
            self.logits += judged.logits[:stop]
        return stop

    def emit(self, tokens: torch.Tensor, logits: torch.Tensor | None = None) -> None:
        """Append the sequence's first token `tokens` (1,) chosen from `logits` (V,) (the prefill's), stopping after
        an EOS, at `max_new_tokens` or where a stopping criterion says."""
        self._write_host()
        room = self.room
        if self.settings.judged_on_host:
            records = self.settings.records and logits is not None
            judged = self.judge(tokens, tokens.shape[0], logits[None] if records else None)
            answers = [] if judged.answers is None else judged.answers.tolist()
            if self.settle(judged, answers) is not None:
                self.finished = True
        strings = self.settings.stopping.strings
        if strings is not None:
            sequence = torch.cat([self.sequence[0], tokens])[None]
            self.finished |= bool(strings(sequence, None).any())
        is_eos = torch.isin(tokens, self.settings.eos_token_ids)
        if bool(is_eos.any()):
            tokens = tokens[: int(is_eos.int().argmax()) + 1]
            self.finished = True
        if tokens.shape[0] >= room:
            tokens = tokens[:room]
            self.finished = True
        self.buffer[0, self.length : self.length + tokens.shape[0]] = tokens
        self.length += tokens.shape[0]
        if tokens.shape[0]:
            self.last_token = int(tokens[-1])
        if self.streamer is not None and tokens.shape[0]:
            self.streamer.put(tokens.cpu())

    def follow(self, streamer: Any) -> None:
        """Let `streamer` follow the sequence from now on, given the prompt and the tokens emitted so far first."""
        self.streamer = streamer
        if streamer is None:
            return
        streamer.put(self.buffer[:, : self.prompt_length].cpu())
        if self.new_tokens:
            streamer.put(self.sequence[0, self.prompt_length :].cpu())

    def close(self) -> None:
        if self.streamer is not None:
            self.streamer.end()
