"""Commit: what a step keeps of what it fed each model, as a pure function of the verdict and the step's shape."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
