"""What one `generate` call did: tokens, steps, acceptance and where the time went."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

PHASES = (
    "target_prefill",
    "draft_prefill",
    "pruning",
    "drafting",
    "verification",
    "acceptance",
    "tree_update",
    "other",
)


@dataclass
class StepRecord:
    """One draft-verify iteration: the confidence it was planned with, the tree's shape and the accepted length.

    `depth` and `width` are the plan's; `tree_depth` is how deep the grown tree reached and `greedy_depth` how far
    the draft's own top-1 path went in it. `seconds` is the step's drafting + verification time; a policy with a
    cost model also records what it predicted: tokens emitted (accepted + 1) and those seconds. `plain` says why the
    sequence drafted nothing in this step (the target's next token alone, as `generate` decodes), None where it
    drafted. `differing` counts its emitted tokens that are not the target's own choice (relaxed verification alone
    makes any).
    """

    alpha: float | None
    depth: int
    width: float
    nodes: int
    accepted: int
    tree_depth: int
    greedy_depth: int
    seconds: float = 0.0
    predicted_tokens: float | None = None
    predicted_seconds: float | None = None
    plain: str | None = None
    differing: int = 0


@dataclass
class SpecStats:
    """Statistics of the last call; `mean_accept_length` is tau: accepted draft tokens per drafting step, bonus
    excluded (steps that drafted nothing are counted in `plain_steps`, and why in `plain_reasons`).

    `verification` says how the tokens were accepted: `"exact"` (the target's own output) or a relaxed rule's label
    (`RelaxedVerification.label`, starting `"relaxed"`), whose output may differ from the target's in
    `differing_tokens` tokens."""

    new_tokens: int = 0
    iterations: int = 0
    mean_accept_length: float = 0.0
    target_prefill_tokens: int = 0
    draft_prefill_tokens: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: list[StepRecord] = field(default_factory=list)
    verification: str = "exact"

    @property
    def differing_tokens(self) -> int:
        """Emitted tokens that are not the target's own choice after what precedes them (0 under exact
        verification)."""
        return sum(s.differing for s in self.steps)

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())

    @property
    def plain_steps(self) -> int:
        """Steps that drafted nothing."""
        return sum(s.plain is not None for s in self.steps)

    @property
    def plain_reasons(self) -> dict[str, int]:
        """How many steps drafted nothing, by why."""
        reasons: dict[str, int] = {}
        for step in self.steps:
            if step.plain is not None:
                reasons[step.plain] = reasons.get(step.plain, 0) + 1
        return reasons

    @classmethod
    def combined(cls, rows: list[SpecStats], batch: SpecStats) -> SpecStats:
        """One call's statistics over sequences decoded together: each row's tokens, steps and prompt phases, and the
        batch's shared phases (drafting, verification, ...) once."""
        labels = [row.verification for row in rows if row.verification != "exact"]
        total = cls(verification=labels[0] if labels else "exact")
        for row in rows:
            total.new_tokens += row.new_tokens
            total.target_prefill_tokens += row.target_prefill_tokens
            total.draft_prefill_tokens += row.draft_prefill_tokens
            total.steps += row.steps
            for phase, seconds in row.phase_seconds.items():
                if phase != "other":
                    total.phase_seconds[phase] += seconds
        for phase, seconds in batch.phase_seconds.items():
            total.phase_seconds[phase] += seconds
        total.iterations = len(total.steps)
        total.mean_accept_length = _tau(total.steps)
        return total

    def finish(self, total_seconds: float) -> None:
        """Close the books: tau from the steps, and the time not in any named phase as `other`."""
        self.iterations = len(self.steps)
        self.mean_accept_length = _tau(self.steps)
        named = sum(v for k, v in self.phase_seconds.items() if k != "other")
        self.phase_seconds["other"] = max(0.0, total_seconds - named)


def _tau(steps: list[StepRecord]) -> float:
    """Accepted draft tokens per step that drafted."""
    drafted = [s.accepted for s in steps if s.plain is None]
    return sum(drafted) / max(1, len(drafted))


class PhaseTimer:
    """Adds each phase's time to `stats.phase_seconds[name]` and keeps the last span of each phase in `last`.

    On the CPU a phase is the wall time between its edges. On CUDA its edges are events recorded on the stream,
    with no synchronisation: `collect()` resolves the phases whose events have completed (the loop calls it right
    after a step's one read, when everything recorded before the read has) and, with `wait`, all of them.
    """

    def __init__(self, stats: SpecStats, device: torch.device):
        self.stats = stats
        self.cuda = device.type == "cuda"
        self.device = device
        self.last: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._pending: list[tuple[str, Any, Any]] = []

    @contextmanager
    def __call__(self, name: str):
        start = self._mark()
        try:
            yield
        finally:
            self._pending.append((name, start, self._mark()))
            if not self.cuda:
                self.collect()

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def collect(self, wait: bool = False) -> None:
        """Book the phases that have finished on the device (every pending one, waiting for it, with `wait`)."""
        still = []
        for name, start, end in self._pending:
            if not self.cuda:
                seconds = end - start
            elif wait or end.query():
                end.synchronize()
                seconds = start.elapsed_time(end) / 1000
            else:
                still.append((name, start, end))
                continue
            self.last[name] = seconds
            self.stats.phase_seconds[name] += seconds
        self._pending = still
