"""The default policy: SAGE's trees for sequences decoded one at a time, chains for sequences decoded together."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import StepOutcome, TreePlan, TreePolicy
from .chain import ChainPolicy
from .sage import SageConfig, SagePolicy


class AutoPolicy(TreePolicy):
    """SAGE's entropy-shaped trees for sequences decoded one at a time, chains for sequences decoded together.

    A batch verifies every row's tree padded to the largest, so one confident row's deep, wide tree costs a token in
    every row, and as the batch fills its verification turns compute-bound: measured on the demo pair, chains decode
    batches of 4 to 32 rows fastest, while SAGE's trees win for one sequence (docs/benchmarks.md). The choice follows
    how a call decodes (`plan` alone, `plan_batch` together), not how many rows happen to be in flight, so a seeded
    sampled job draws the same text when resumed at the same batch size. Each row still keeps SAGE's confidence.
    """

    name = "auto"

    def __init__(self, sage: SageConfig | None = None, chain_length: int = 5):
        self.sage = SagePolicy(sage)
        self.chain = ChainPolicy(chain_length)

    def reset(self) -> None:
        self.sage.reset()

    def plan(self) -> TreePlan:
        return self.sage.plan()

    def plan_batch(self, rows: Sequence[TreePolicy]) -> list[TreePlan]:
        return [self.chain.plan() for _ in rows]

    def statistics(self, root_log_probs: torch.Tensor) -> torch.Tensor:
        return self.sage.statistics(root_log_probs)

    def observe(self, step: StepOutcome) -> None:
        self.sage.observe(step)

    @property
    def confidence(self) -> float | None:
        return self.sage.confidence
