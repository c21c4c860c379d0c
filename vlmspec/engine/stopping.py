"""What ends a sequence besides EOS and its token budget, decided as `generate` decides it: after each emitted token,
in order, so a step that accepts several tokens emits exactly the prefix up to the token where `generate` stops.

Stop strings are a pure function of a sequence's last tokens: every row's are checked on the device over all of a
step's emitted tokens at once (transformers' `StopStringCriteria` over the window that ends at each of them), cut
beside EOS and read with the step. A time limit is the host's clock. Any other criterion is Python the engine cannot
see into: it is called once per emitted token on the sequence up to that token (launches per token, paid only by
rows that have one), and every row's answers are read together, one read a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteriaList
from transformers.generation.stopping_criteria import MaxTimeCriteria, StopStringCriteria

from ..device_tensors import arange, host_values

#: An id past every vocabulary: `StopStringCriteria` clips it to its dummy token, which matches no stop string, so
#: it pads the windows of sequences shorter than a stop string can span.
OUT_OF_VOCABULARY = 2**62

#: What the criteria receive as `scores` once j tokens are emitted: `generate`'s processed scores so far, or None.
ScoresUpTo = Callable[[int], "tuple[torch.Tensor, ...] | None"]


@dataclass
class Stopping:
    """A sequence's stopping criteria besides EOS and the budget: `strings` (checked on the device), `deadline` (a
    `MaxTimeCriteria`, checked on the host's clock) and `criteria` (any others, called once per emitted token)."""

    strings: StopStringCriteria | None = None
    deadline: MaxTimeCriteria | None = None
    criteria: StoppingCriteriaList = field(default_factory=StoppingCriteriaList)

    @property
    def on_host(self) -> bool:
        """Whether a step's emitted tokens must be judged on the host too (a time limit or Python criteria)."""
        return self.deadline is not None or len(self.criteria) > 0

    def past_deadline(self) -> bool:
        """Whether the time limit has passed (then `generate` stops after the next token)."""
        return self.deadline is not None and time.time() - self.deadline.initial_timestamp > self.deadline.max_time

    def answers(
        self, before: torch.Tensor, tokens: torch.Tensor, count: int, scores: ScoresUpTo
    ) -> torch.Tensor | None:
        """Whether the Python criteria stop the sequence right after each of the first `count` of `tokens` (k,)
        (after `before` (T,)): (count,) bool on the device, unread (None without criteria). They are called in
        order, once per token, on the sequence up to it; `scores(j)` is what they receive as `scores` after j tokens
        (generate's processed scores so far, or None). Calls after the first that stops cannot change its answer
        (each answer is computed when its call returns), so every row's answers are read at once, not one by one."""
        if not self.criteria or count == 0:
            return None
        said = [self.criteria(torch.cat([before, tokens[:j]])[None], scores(j)).any() for j in range(1, count + 1)]
        return torch.stack(said)


def first_stop(answers: list[bool]) -> int | None:
    """How many tokens are emitted when the criteria's `answers` (after each token, as read) stop the sequence: up
    to the first True; None when none does."""
    return answers.index(True) + 1 if True in answers else None


class StringCheck:
    """Every row's stop strings over a step's emitted tokens: `tail` (B, W - 1) holds each row's last tokens before
    the step (padded on the left where the row is shorter), `groups` each distinct criterion with the rows it serves
    ((B,) bool on the device, None: all rows)."""

    def __init__(self, tail: torch.Tensor, groups: list[tuple[StopStringCriteria, torch.Tensor | None]]):
        self.tail = tail
        self.groups = groups

    def row(self, b: int) -> StringCheck:
        """Row `b`'s check alone."""
        return StringCheck(self.tail[b : b + 1], [(c, None if m is None else m[b : b + 1]) for c, m in self.groups])

    def hits(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, k) whether each row's sequence ends in one of its stop strings right after each of its emitted
        `tokens` (B, k)."""
        rows, k = tokens.shape
        width = self.tail.shape[1] + 1
        windows = (
            torch.cat([self.tail, tokens.to(self.tail.device)], dim=1).unfold(1, width, 1).reshape(rows * k, width)
        )
        found = None
        for criterion, serves in self.groups:
            hit = criterion(windows, None).view(rows, k)
            if serves is not None:
                hit = hit & serves[:, None]
            found = hit if found is None else found | hit
        return found.to(tokens.device)

    def advance(self, tokens: torch.Tensor, counts: list[int]) -> None:
        """Move every row's window (`tail`) past the first `counts[b]` of its emitted `tokens` (B, k), in one
        gather."""
        span = self.tail.shape[1]
        joined = torch.cat([self.tail, tokens.to(self.tail.device)], dim=1)
        starts = host_values(counts, joined.device)[:, None]
        self.tail = joined.gather(1, starts + arange(span, joined.device)[None])


def string_check(sinks: Sequence, device: torch.device) -> StringCheck | None:
    """The rows' `StringCheck` on `device`, from their `TokenSink`s' last tokens (None when no row has stop
    strings): made when the rows join or leave, then moved on by each step (`StringCheck.advance`)."""
    criteria = [sink.settings.stopping.strings for sink in sinks]
    if all(c is None for c in criteria):
        return None
    span = max(c.maximum_token_len for c in criteria if c is not None) - 1
    tails = []
    for sink in sinks:
        own = sink.sequence[0, max(0, sink.length - span) :].to(device)
        tails.append(torch.nn.functional.pad(own, (span - own.shape[0], 0), value=OUT_OF_VOCABULARY))
    distinct = list({id(c): c for c in criteria if c is not None}.values())
    groups = []
    for criterion in distinct:
        serves = [c is criterion for c in criteria]
        groups.append((criterion, None if all(serves) else host_values(serves, device, torch.bool)))
    return StringCheck(torch.stack(tails), groups)
