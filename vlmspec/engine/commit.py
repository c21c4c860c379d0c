"""Commit: what a step keeps of what it fed each model, as a pure function of what the step's one read told the host.

The host knows every row's accepted path and emitted tokens after the read, so the commit is host arithmetic: each
row's offsets to keep in both caches and the tokens its draft has not seen yet, written to the device in one copy
that does not wait for it. One sequence is a batch of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..device_tensors import host_values
from .acceptance import StepReport


@dataclass
class CommitPlan:
    """A step's commit for every row: row b keeps the first `target_counts[b]` offsets of `target` (B, W) from where
    the step's tree starts in the target's cache (the root and the accepted nodes), and the first `draft_counts[b]`
    of `draft` from where the step starts in the draft's cache (the pending tokens it fed and the accepted nodes the
    draft holds); `pending` (B, P) holds, first `pending_counts[b]`, the emitted tokens row b's draft has not seen
    (the accepted ones deeper than the levels it was fed, then the bonus token), fed first at the next step."""

    target: torch.Tensor
    target_counts: list[int]
    draft: torch.Tensor
    draft_counts: list[int]
    pending: torch.Tensor
    pending_counts: list[int]

    def row(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row `b`'s target offsets, draft offsets and pending tokens (views)."""
        return (
            self.target[b, : self.target_counts[b]],
            self.draft[b, : self.draft_counts[b]],
            self.pending[b, : self.pending_counts[b]],
        )


def plan_commit(
    reports: Sequence[StepReport],
    fed: Sequence[int],
    cached_depths: Sequence[int],
    slots: Sequence[Sequence[int] | None],
    device: torch.device,
    draft_device: torch.device | None = None,
) -> CommitPlan:
    """The commit of every row of a step from its `report` (the accepted path from the root on and the emitted
    tokens: the accepted draft tokens, then the bonus token). Row b's draft was fed `fed[b]` pending tokens, then
    `cached_depths[b]` levels of its tree; `slots[b]` maps a node to its slot among the tokens fed after the pending
    ones when a masked plan padded the levels (None when nodes and slots coincide). The target's offsets land on
    `device`, the draft's and the pending tokens on `draft_device` (the same by default)."""
    targets, drafts, pendings = [], [], []
    for report, own_fed, cached, own_slots in zip(reports, fed, cached_depths, slots, strict=True):
        in_draft = min(report.accepted, cached)
        fed_path = report.path[1 : in_draft + 1]
        if own_slots is not None:
            fed_path = [own_slots[node] for node in fed_path]
        targets.append(report.path[: report.accepted + 1])
        drafts.append(list(range(own_fed)) + [slot + own_fed - 1 for slot in fed_path])
        pendings.append(report.tokens[in_draft : report.accepted + 1])
    # The pending tokens come first: the draft's next root step takes them as they lie (no storage offset).
    blocks = [pendings, drafts, targets]
    widths = [max(len(values) for values in block) for block in blocks]
    flat = [v for block, width in zip(blocks, widths, strict=True) for values in block for v in _padded(values, width)]
    rows = len(reports)
    written = host_values(flat, device)
    ends = [rows * widths[0], rows * (widths[0] + widths[1])]
    held, target = written[: ends[1]], written[ends[1] :].view(rows, widths[2])
    if draft_device is not None and torch.device(draft_device) != written.device:
        held = held.to(draft_device)
    pending, draft = held[: ends[0]].view(rows, widths[0]), held[ends[0] :].view(rows, widths[1])
    counts = [[len(values) for values in block] for block in blocks]
    return CommitPlan(target, counts[2], draft, counts[1], pending, counts[0])


def _padded(values: Sequence[int], width: int) -> list[int]:
    return list(values) + [0] * (width - len(values))
