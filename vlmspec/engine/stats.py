"""What one `generate` call did: tokens, steps, acceptance and where the time went."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

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
    cost model also records what it predicted: tokens emitted (accepted + 1) and those seconds.
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


@dataclass
class SpecStats:
    """Statistics of the last call; `mean_accept_length` is tau: accepted draft tokens per step, bonus excluded."""

    new_tokens: int = 0
    iterations: int = 0
    mean_accept_length: float = 0.0
    target_prefill_tokens: int = 0
    draft_prefill_tokens: int = 0
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())

    def finish(self, total_seconds: float) -> None:
        """Close the books: tau from the steps, and the time not in any named phase as `other`."""
        self.iterations = len(self.steps)
        self.mean_accept_length = sum(s.accepted for s in self.steps) / max(1, self.iterations)
        named = sum(v for k, v in self.phase_seconds.items() if k != "other")
        self.phase_seconds["other"] = max(0.0, total_seconds - named)


class PhaseTimer:
    """Adds wall time to `stats.phase_seconds[name]` (and keeps each phase's last span in `last`); on CUDA it
    synchronises so that time lands in its phase."""

    def __init__(self, stats: SpecStats, device: torch.device):
        self.stats = stats
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.last: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def __call__(self, name: str):
        if self.sync:
            self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                self.sync()
            self.last[name] = time.perf_counter() - start
            self.stats.phase_seconds[name] += self.last[name]
