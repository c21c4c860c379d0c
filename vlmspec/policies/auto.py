"""The default policy: SAGE's trees for sequences decoded one at a time, chains of a measured length for sequences
decoded together, and plain steps wherever drafting does not pay (`draft_gate`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import StepLesson, StepOutcome, TreePlan, TreePolicy
from .chain import chain_plan
from .chain_length import ChainLength, ChainLengthConfig
from .draft_gate import NOT_PAYING, DraftGateConfig, RowGate, StepCosts, choose_drafting
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
    confidence. Where drafting does not pay (a draft that does not match the target, a context past what it handles,
    a batch whose verification is compute-bound) rows take plain steps, probing now and then (`draft_gate`): decoding
    then costs what plain `generate` costs.
    """

    name = "auto"

    def __init__(
        self,
        sage: SageConfig | None = None,
        chain: ChainLengthConfig | None = None,
        gate: DraftGateConfig | None = None,
    ):
        self.sage = SagePolicy(sage)
        self.lengths = ChainLength(chain)
        self.costs = StepCosts(gate or DraftGateConfig())
        self.gate = RowGate(self.costs)

    def for_row(self) -> AutoPolicy:
        """A row's policy: its own SAGE state and gate; the chain length and the step costs are learned by the batch,
        shared with every row (and kept across calls)."""
        row = AutoPolicy(self.sage.config, self.lengths.config, self.costs.config)
        row.lengths, row.costs = self.lengths, self.costs
        row.gate = RowGate(self.costs)
        return row

    def reset(self) -> None:
        self.sage.reset()
        self.gate = RowGate(self.costs)

    def drafting(self, rows: Sequence[TreePolicy], sampling: Sequence[bool], rooms: Sequence[int]) -> list[str | None]:
        return choose_drafting([row.gate for row in rows], sampling, rooms)

    def observe_plain(self, rows: Sequence[TreePolicy], reasons: Sequence[str | None], seconds: float) -> None:
        self.costs.observe(len(rows), seconds, drafted=False)
        for row, reason in zip(rows, reasons, strict=True):
            if reason == NOT_PAYING:
                row.gate.skipped()

    def plan(self) -> TreePlan:
        return self.sage.plan()

    def plan_batch(self, rows: Sequence[TreePolicy], timed: bool = True) -> list[TreePlan]:
        return [chain_plan(self.lengths.choose(len(rows), timed))] * len(rows)

    def statistics(self, root_log_probs: torch.Tensor) -> torch.Tensor:
        return self.sage.statistics(root_log_probs)

    def observe(self, step: StepOutcome) -> StepLesson:
        """Time the step (once per batch); where the row drafted, its tokens feed its gate, SAGE and, for a chain,
        the chain lengths. Returns SAGE's lesson (the alpha it last planned with), that alpha alone where the row
        rode along with its root."""
        batch, drafted = step.batch, step.tree.size - 1
        rows = 1 if batch is None else batch.rows
        if batch is None or batch.first:
            self.costs.observe(rows, step.seconds, drafted=True)
        if not step.drafted:
            self.gate.skipped()
            return StepLesson(alpha=self.sage.confidence)
        self.gate.observe(step.accepted + 1, rows, step.sampled)
        lesson = self.sage.observe(step)
        if batch is not None or step.tree.depth == drafted:
            # A chain (a row alone decodes SAGE's trees, which teach the chains nothing).
            self.lengths.observe_row(step.accepted, drafted, rows)
        if batch is not None and batch.first:
            self.lengths.observe_step(batch.rows, batch.tree_tokens // batch.rows - 1, step.seconds)
        return lesson
