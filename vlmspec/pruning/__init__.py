"""Visual token pruning for the draft: score tokens by the verifier's attention, then select which to keep."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..adapters import VisualLayout
from .scores import VerifierScores, scoring
from .select import group_budgets, select_random, select_two_stage, select_uniform

PRUNING_METHODS = ("verifier", "uniform", "random")


@dataclass
class PruningConfig:
    """How the draft's visual tokens are pruned.

    `ratio` is the share of visual tokens dropped; None picks the SAGE paper's defaults: 0.9 when the prompt
    holds video, 0.8 for images only. `verifier_share` is the share of each group's budget chosen by attention
    (stage I); `layers` the target layers whose attention is averaged (None: all); `seed` drives `random`.
    """

    method: str = "verifier"
    ratio: float | None = None
    verifier_share: float = 0.5
    layers: tuple[int, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        if self.method not in PRUNING_METHODS:
            raise ValueError(
                f"unknown pruning method {self.method!r}; choose one of {', '.join(PRUNING_METHODS)} or None"
            )
        if self.ratio is not None and not 0.0 <= self.ratio < 1.0:
            raise ValueError(f"prune_ratio must be in [0, 1), got {self.ratio}")

    def ratio_for(self, has_video: bool) -> float:
        if self.ratio is not None:
            return self.ratio
        return 0.9 if has_video else 0.8

    def keep_mask(self, layout: VisualLayout, has_video: bool, scores: torch.Tensor | None) -> torch.Tensor:
        """Bool over the prompt: every text token and the selected visual tokens."""
        ratio = self.ratio_for(has_video)
        if self.method == "verifier" and scores is not None and bool(scores.any()):
            kept = select_two_stage(layout.groups, ratio, scores, self.verifier_share)
        elif self.method == "random":
            kept = select_random(layout.groups, ratio, self.seed)
        else:
            kept = select_uniform(layout.groups, ratio)
        keep = ~layout.mask
        keep[layout.positions[kept.to(layout.mask.device)]] = True
        return keep


def resolve_pruning(
    pruning: str | PruningConfig | None, prune_ratio: float | None, head: bool = False
) -> PruningConfig | None:
    """A config from a method name (with an optional ratio), a config, or None (the draft sees every token).

    `"auto"` (the default everywhere) is `"verifier"` for a VLM draft and None for a draft head (`head`): pruning
    saves a VLM draft the visual tokens' prefill through its whole model, while a head's prompt pass is one layer, and
    the target's features of every visual token are what it reads (docs/heads.md measures the difference)."""
    if pruning == "auto":
        pruning = None if head else "verifier"
    if pruning is None:
        return None
    if isinstance(pruning, PruningConfig):
        return pruning
    return PruningConfig(method=pruning, ratio=prune_ratio)


__all__ = [
    "PRUNING_METHODS",
    "PruningConfig",
    "VerifierScores",
    "scoring",
    "group_budgets",
    "resolve_pruning",
    "select_random",
    "select_two_stage",
    "select_uniform",
]
