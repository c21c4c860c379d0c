"""Commit: what a step keeps of what it fed each model, as a pure function of the verdict and the step's shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .counting import arange, host_values


@dataclass
class CommitPlan:
    """A step's commit for one sequence.

    `target` (accepted + 1,): offsets, from where the step's tree starts in the target's cache, of the root and the
    accepted nodes. `draft`: offsets, from where the step starts in the draft's cache, of the pending tokens it fed
    and of the accepted nodes the draft holds. `pending`: the emitted tokens the draft has not seen yet (the accepted
    ones deeper than the levels it was fed, then the bonus token), fed first at the next step.
    """

    target: torch.Tensor
    draft: torch.Tensor
    pending: torch.Tensor


def plan_commit(
    path: torch.Tensor,
    accepted: int,
    tokens: torch.Tensor,
    fed: int,
    cached_depth: int,
    slots: torch.Tensor | None,
    draft_device: torch.device,
) -> CommitPlan:
    """The commit of a step whose verdict took `path` (depth + 1,) node indices from the root on, `accepted` of them
    past the root, emitting `tokens` (the accepted draft tokens, then the bonus token). The draft was fed `fed`
    pending tokens, then `cached_depth` levels of the tree; `slots` maps a node to its slot among the tokens the draft
    was fed after the pending ones when a masked plan padded the levels (None when nodes and slots coincide)."""
    in_draft = min(accepted, cached_depth)
    draft_path = path[1 : in_draft + 1].to(draft_device)
    if slots is not None:
        draft_path = slots[draft_path]
    draft = torch.cat([torch.arange(fed, device=draft_device), draft_path + (fed - 1)])
    return CommitPlan(path[: accepted + 1], draft, tokens[in_draft : accepted + 1].to(draft_device))


@dataclass
class RowsCommit:
    """A step's commit for every row at once: `draft` (B, W) offsets, from where each row's step starts in the draft's
    cache, of what it keeps (row b's first `draft_counts[b]`), and `pending` (B, P) the tokens each row's draft has
    not seen yet (row b's first `pending_counts[b]`). The target keeps each row's accepted path itself: its first
    `accepted[b] + 1` nodes."""

    draft: torch.Tensor
    draft_counts: list[int]
    pending: torch.Tensor
    pending_counts: list[int]


def plan_commit_rows(
    path: torch.Tensor,
    accepted: list[int],
    tokens: torch.Tensor,
    fed: list[int],
    cached_depth: int,
    draft_device: torch.device,
) -> RowsCommit:
    """`plan_commit` of every row of a step whose rows drafted one tree shape (nodes and draft slots coincide):
    `path` (B, depth + 1) and `tokens` (B, depth + 1) are the rows' accepted nodes and emitted tokens, `accepted`
    their accepted counts and `fed` their pending counts (host). A fixed number of operations, whatever the rows."""
    in_draft = [min(a, cached_depth) for a in accepted]
    path, tokens = path.to(draft_device), tokens.to(draft_device)
    # Slot j of row b holds pending token j below fed[b], then the node at depth j - fed[b] + 1 of its path.
    shift = host_values([f - 1 for f in fed], draft_device)[:, None]
    slots = arange(max(fed) + cached_depth, draft_device)[None]
    from_path = path.gather(1, (slots - shift).clamp(0, path.shape[1] - 1)) + shift
    draft = torch.where(slots <= shift, slots, from_path)
    pending_counts = [a - d + 1 for a, d in zip(accepted, in_draft, strict=True)]
    first = host_values(in_draft, draft_device)[:, None]
    columns = (first + arange(max(pending_counts), draft_device)).clamp_max(tokens.shape[1] - 1)
    return RowsCommit(
        draft, [f + d for f, d in zip(fed, in_draft, strict=True)], tokens.gather(1, columns), pending_counts
    )
