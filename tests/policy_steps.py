"""Finished steps to feed a policy's `observe`, built from real draft trees."""

from __future__ import annotations

import torch

from vlmspec.engine.tree import TreeBuilder
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
    builder = TreeBuilder(len(probs), torch.device("cpu"))
    builder.start(torch.tensor(0))
    log_prob = 0.0
    for depth, p in enumerate(probs):
        log_prob += float(torch.tensor(p).log())
        builder.add_level(torch.tensor([depth]), torch.tensor([depth + 1]), torch.tensor([log_prob]), torch.tensor([0]))
    tree = builder.build()
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
