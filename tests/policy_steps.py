"""Finished steps to feed a policy's `observe`, built from real draft trees."""

from __future__ import annotations

import torch
from one_tree import made_tree

from vlmspec.policies import StepOutcome


def chain_step(
    root_log_probs: torch.Tensor,
    accepted: int,
    probs: list[float] | None = None,
    *,
    draft_seconds: float = 0.01,
    verify_seconds: float = 0.02,
    context: int = 100,
) -> StepOutcome:
    """A chain of `len(probs)` draft tokens (conditional draft probabilities `probs`, default one 0.9 per accepted
    token plus one) of which the first `accepted` were accepted."""
    probs = probs if probs is not None else [0.9] * (accepted + 1)
    path_log_probs = torch.tensor(probs).log().cumsum(0).tolist()
    tree = made_tree(0, list(range(len(probs))), list(range(1, len(probs) + 1)), path_log_probs)
    return StepOutcome(
        root_log_probs=root_log_probs,
        accepted=accepted,
        tree=tree,
        path=torch.arange(accepted + 1),
        draft_forwards=len(probs),
        draft_tokens=len(probs),
        draft_context=context,
        target_context=context,
        draft_seconds=draft_seconds,
        verify_seconds=verify_seconds,
        seconds=draft_seconds + verify_seconds,
    )
