"""Confidence-modulated draft length: chains as long as the draft's recent confidence says, lossless.

At each drafted position the draft's distribution gives three confidences in [0, 1]: entropy-based
C_ent = 1 - H / log|V| (H over the whole vocabulary), logit margin C_marg = sigmoid(beta (z1 - z2)) and softmax margin
C_soft = p1 - p2, for its top two tokens; they are mixed as C = l1 C_ent + l2 C_marg + l3 C_soft with l1 + l2 + l3 = 1
(the seed's "unified confidence score"). A step's chain of k tokens is k = min(k_max, max(k_min, floor(a C k_max)))
(its drafting-length map), C the mean over the positions the last chain drafted. Under a generation config the
distributions are the processed ones the draft proposes from (z1 - z2 is then the gap of their log-probabilities,
which equals the logits' under a plain softmax).

The seed decides k within a step, from a speculative pass over k_max positions; here step t's chain sets step
t + 1's length, so the step keeps one read and a drafted token is never thrown away unverified. The seed's relaxed
verification (accepting a draft token within a margin of the target's top token) changes the output and is not built:
every token is the target's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .base import StepLesson, StepOutcome, TreePlan, TreePolicy
from .chain import chain_plan
from .levels import NodeMeasure

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..engine.tree import Trees


@dataclass(frozen=True)
class ConfidenceConfig:
    """`weights` (l1, l2, l3) of the entropy, logit-margin and softmax-margin confidences (non-negative, summing to
    1); `sharpness` the logit margin's beta; `aggressiveness` a in (0, 1]; chains of `k_min` to `k_max` tokens,
    `initial_length` before the first measure."""

    weights: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)
    sharpness: float = 1.0
    aggressiveness: float = 1.0
    k_min: int = 1
    k_max: int = 8
    initial_length: int = 5

    def __post_init__(self):
        if len(self.weights) != 3 or min(self.weights) < 0 or not math.isclose(sum(self.weights), 1.0):
            raise ValueError(f"weights must be three non-negative numbers summing to 1, got {self.weights}")
        if self.sharpness <= 0 or not 0 < self.aggressiveness <= 1:
            raise ValueError("sharpness must be positive and aggressiveness in (0, 1]")
        if not 1 <= self.k_min <= self.initial_length <= self.k_max:
            raise ValueError(f"need 1 <= k_min <= initial_length <= k_max, got {self.k_min}, {self.k_max}")


@dataclass(frozen=True)
class ConfidenceMix:
    """C = l1 C_ent + l2 C_marg + l3 C_soft at every expanded node (B, F, 1), from its proposal log-probabilities
    (B, F, V) and their sorted top (B, F, k)."""

    weights: tuple[float, float, float]
    sharpness: float

    def __call__(self, log_probs: torch.Tensor, top_log_probs: torch.Tensor) -> torch.Tensor:
        return mixed_confidence(log_probs, top_log_probs, self.weights, self.sharpness)[..., None]


def mixed_confidence(
    log_probs: torch.Tensor, top_log_probs: torch.Tensor, weights: tuple[float, float, float], sharpness: float
) -> torch.Tensor:
    """The unified confidence (...,) of distributions given as log-probabilities (..., V) (-inf for a cut token),
    `top_log_probs` their sorted top (two are taken from `log_probs` where fewer are given)."""
    log_probs = log_probs.float()
    entropy = torch.special.entr(log_probs.exp()).sum(-1)
    by_entropy = (1.0 - entropy / math.log(log_probs.shape[-1])).clamp(0.0, 1.0)
    top = top_log_probs.float() if top_log_probs.shape[-1] >= 2 else log_probs.topk(2, dim=-1).values
    by_logits = torch.sigmoid(sharpness * (top[..., 0] - top[..., 1]))
    by_softmax = top[..., 0].exp() - top[..., 1].exp()
    return weights[0] * by_entropy + weights[1] * by_logits + weights[2] * by_softmax


def mean_chain_confidence(trees: Trees) -> torch.Tensor:
    """Each row's mean confidence (B,) over its tree's measured nodes (the positions its chain drafted: the root's
    distribution and each drafted token's but the last); NaN where none was measured."""
    rows = trees.tokens.shape[0]
    if trees.node_statistics is None:
        return torch.full((rows,), torch.nan, device=trees.tokens.device)
    values = trees.node_statistics[..., 0]
    measured = ~values.isnan()
    if trees.valid is not None:
        measured = measured & trees.valid
    count = measured.sum(1)
    total = torch.where(measured, values, 0.0).sum(1)
    return torch.where(count > 0, total / count.clamp_min(1), torch.nan)


def draft_length(confidence: float, config: ConfidenceConfig) -> int:
    """k = min(k_max, max(k_min, floor(a C k_max)))."""
    return min(config.k_max, max(config.k_min, math.floor(config.aggressiveness * confidence * config.k_max)))


class ConfidencePolicy(TreePolicy):
    """Chains whose length follows the draft's mixed confidence over the last chain's positions."""

    name = "confidence"

    def __init__(self, config: ConfidenceConfig | None = None):
        self.config = config or ConfidenceConfig()
        self.measure = NodeMeasure(1, ConfidenceMix(self.config.weights, self.config.sharpness))
        self.reset()

    def reset(self) -> None:
        self.length = self.config.initial_length

    def plan(self) -> TreePlan:
        return chain_plan(self.length, self.measure)

    def plan_batch(self, rows: Sequence[TreePolicy], timed: bool = True) -> list[TreePlan]:
        """A batch verifies every row's chain padded to the longest, so every greedy row drafts the longest row's
        length: as cheap to verify, and one shared chain grows without gathers. Where a row samples (`timed` False)
        each row drafts its own length, so its seeded draws follow its own history alone, not what else is in
        flight."""
        if not timed:
            return [row.plan() for row in rows]
        return [chain_plan(max(row.length for row in rows), self.measure)] * len(rows)

    def path_statistics(self, trees: Trees) -> torch.Tensor:
        return mean_chain_confidence(trees)[:, None]

    def observe(self, step: StepOutcome) -> StepLesson:
        """The next chain's length from this chain's mean confidence (unchanged where it measured none)."""
        if step.drafted and step.statistics:
            confidence = step.statistics[0]
            if not math.isnan(confidence):
                self.length = draft_length(confidence, self.config)
        return StepLesson()
