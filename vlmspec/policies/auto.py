"""The default policy: SAGE's trees for sequences decoded one at a time, chains of a measured length for sequences
decoded together."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import torch

from .base import RankTreePlan, StepOutcome, TreePlan, TreePolicy
from .chain_length import ChainLength, ChainLengthConfig
from .sage import SageConfig, SagePolicy


class AutoPolicy(TreePolicy):
    """SAGE's entropy-shaped trees for sequences decoded one at a time, chains for sequences decoded together.

    A batch verifies every row's tree padded to the largest, so one confident row's deep, wide tree costs a token in
    every row, and as the batch fills its verification turns compute-bound: measured on the demo pair, chains decode
    batches of 4 to 32 rows fastest, while SAGE's trees win for one sequence (docs/benchmarks.md). The choice follows
    how a call decodes (`plan` alone, `plan_batch` together), not how many rows happen to be in flight. A greedy
    batch's chains are as long as the steps measured so far say pays best (`ChainLength`, shared by the rows and kept
    across calls); a batch with a sampling row drafts `chain.default` tokens, so its seeded draws do not depend on the
    machine's speed and a seeded job resumed at the same batch size draws the same text. Each row keeps SAGE's
    confidence.
    """

    name = "auto"

    def __init__(self, sage: SageConfig | None = None, chain: ChainLengthConfig | None = None):
        self.sage = SagePolicy(sage)
        self.lengths = ChainLength(chain)

    def for_row(self) -> AutoPolicy:
        """A row's policy: its own SAGE state; the chain length is learned by the batch, shared with every row."""
        row = AutoPolicy(self.sage.config, self.lengths.config)
        row.lengths = self.lengths
        return row

    def reset(self) -> None:
        self.sage.reset()

    def plan(self) -> TreePlan:
        return self.sage.plan()

    def plan_batch(self, rows: Sequence[TreePolicy], timed: bool = True) -> list[TreePlan]:
        return [_chain(self.lengths.choose(len(rows), timed))] * len(rows)

    def statistics(self, root_log_probs: torch.Tensor) -> torch.Tensor:
        return self.sage.statistics(root_log_probs)

    def observe(self, step: StepOutcome) -> None:
        self.sage.observe(step)
        batch, drafted = step.batch, step.tree.size - 1
        if batch is not None or step.tree.depth == drafted:
            # A chain (a row alone decodes SAGE's trees, which teach the chains nothing).
            self.lengths.observe_row(step.accepted, drafted, 1 if batch is None else batch.rows)
        if batch is not None and batch.first:
            self.lengths.observe_step(batch.rows, batch.tree_tokens // batch.rows - 1, step.seconds)

    @property
    def confidence(self) -> float | None:
        return self.sage.confidence


@cache
def _chain(length: int) -> RankTreePlan:
    """The chain of `length` draft tokens (one plan per length, shared: a rank tree never changes)."""
    return RankTreePlan([[0] * d for d in range(1, length + 1)])
