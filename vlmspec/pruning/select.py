"""Which visual tokens the draft keeps: two-stage (verifier scores, then uniform), uniform, random.

Budgets are per group (an image or a video frame): a group of n tokens keeps ceil((1 - ratio) n), so every frame
keeps at least its share and the draft sees `text + sum over groups of ceil((1 - ratio) n_g)` prompt tokens.
Selections are returned as sorted indices into the visual tokens, so kept tokens stay in prompt order.
"""

from __future__ import annotations

import math

import torch


def group_budgets(groups: torch.Tensor, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group: its token count and how many it keeps at prune `ratio`."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"prune ratio must be in [0, 1), got {ratio}")
    counts = torch.bincount(groups) if groups.numel() else groups.new_zeros(0)
    keep = torch.tensor([math.ceil((1.0 - ratio) * int(n)) for n in counts], dtype=torch.long)
    return counts, keep


def spread(n: int, k: int) -> torch.Tensor:
    """k indices evenly spaced over range(n) (centres of k equal strides)."""
    return ((torch.arange(k) + 0.5) * n / k).long() if k else torch.zeros(0, dtype=torch.long)


def select_uniform(groups: torch.Tensor, ratio: float) -> torch.Tensor:
    """Evenly spaced tokens within each group (raster order, so spread over the picture)."""
    return _per_group(groups, ratio, lambda members, k: members[spread(members.shape[0], k)])


def select_random(groups: torch.Tensor, ratio: float, seed: int = 0) -> torch.Tensor:
    """A seeded random sample within each group."""
    generator = torch.Generator().manual_seed(seed)
    return _per_group(
        groups, ratio, lambda members, k: members[torch.randperm(members.shape[0], generator=generator)[:k]]
    )


def select_two_stage(
    groups: torch.Tensor, ratio: float, scores: torch.Tensor, verifier_share: float = 0.5
) -> torch.Tensor:
    """Stage I: a group's top-scoring tokens, `verifier_share` of its budget; stage II: an even spread of the rest."""
    if not 0.0 <= verifier_share <= 1.0:
        raise ValueError(f"verifier_share must be in [0, 1], got {verifier_share}")
    scores = scores.cpu()

    def pick(members: torch.Tensor, k: int) -> torch.Tensor:
        top = min(k, math.ceil(verifier_share * k))
        stage1 = members[scores[members].topk(top).indices] if top else members[:0]
        rest = members[~torch.isin(members, stage1)]
        return torch.cat([stage1, rest[spread(rest.shape[0], k - top)]])

    return _per_group(groups, ratio, pick)


def _per_group(groups: torch.Tensor, ratio: float, pick) -> torch.Tensor:
    groups = groups.cpu()
    counts, budgets = group_budgets(groups, ratio)
    order = torch.argsort(groups, stable=True)
    chosen, start = [], 0
    for count, k in zip(counts.tolist(), budgets.tolist(), strict=True):
        members = order[start : start + count]
        chosen.append(pick(members, k))
        start += count
    return torch.cat(chosen).sort().values if chosen else torch.zeros(0, dtype=torch.long)
