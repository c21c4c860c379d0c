"""SAGE: entropy-guided adaptive draft trees with acceptance-history feedback on the maximum depth.

From the draft's distribution at the root of step t, alpha = 1 - H(top-k renormalised) / log k sets the tree of
step t + 1: depth D = D_min + alpha (D_max - D_min), width W = W_min + (1 - alpha)(W_max - W_min). Below the
first level a node keeps children of rank < W_l = W / l * (0.5 + P_parent) whose cumulative probability exceeds
theta_l = c * l / D, until depth D or the node cap. A window of recent acceptance lengths moves D_max.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .base import RankTreePlan, StepLesson, StepOutcome, TreePlan, TreePolicy
from .levels import RowRule
from .static import SPECVLM_TREE


@dataclass
class SageConfig:
    """Every number of the SAGE policy; defaults are the paper's (section 5.1).

    `depth_max_floor`/`depth_max_ceiling` bound how far the history may move D_max. After the history moves D_max
    the window starts afresh, so each further move needs a full window of new evidence.

    `fixed_shapes` grows every level as a fixed number of slots, the children the widths, thresholds and node cap
    reject masked, so drafting never waits for the device (one read after drafting drops the padding); the draft
    then runs all D levels. None (the default) does so on accelerators only: on a CPU a read costs nothing and
    the draft stops at the first empty level instead (measured in docs/benchmarks.md). Either way the trees are
    the same.
    """

    top_k: int = 10
    depth_min: int = 3
    depth_max: int = 8
    width_min: float = 2.0
    width_max: float = 10.0
    max_nodes: int = 64
    threshold_scale: float = 0.1
    initial_alpha: float = 0.5
    history_window: int = 10
    history_low: float = 2.0
    history_high: float = 3.0
    depth_max_floor: int = 3
    depth_max_ceiling: int = 12
    initial_tree: Sequence[Sequence[int]] = field(default_factory=lambda: SPECVLM_TREE)
    fixed_shapes: bool | None = None

    def __post_init__(self):
        if not 1 <= self.depth_min <= self.depth_max:
            raise ValueError(f"need 1 <= depth_min <= depth_max, got {self.depth_min}, {self.depth_max}")
        if not 1 <= self.width_min <= self.width_max <= self.top_k:
            raise ValueError(
                f"need 1 <= width_min <= width_max <= top_k, got {self.width_min}, {self.width_max}, {self.top_k}"
            )
        if not self.depth_min <= self.depth_max_floor <= self.depth_max <= self.depth_max_ceiling:
            raise ValueError("need depth_min <= depth_max_floor <= depth_max <= depth_max_ceiling")
        if self.max_nodes < 1 or self.history_window < 1:
            raise ValueError("max_nodes and history_window must be positive")


def confidence_tensor(root_log_probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """alpha = 1 - H / log k over the renormalised top-k probabilities of `root_log_probs` (..., V), on the device:
    1 for one-hot, 0 for uniform (one value per row)."""
    top = root_log_probs.topk(top_k, dim=-1).values.float()
    p = torch.softmax(top, dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return (1.0 - entropy / math.log(top_k)).clamp(0.0, 1.0)


def confidence(root_log_probs: torch.Tensor, top_k: int) -> float:
    """alpha as a number (reading it from the device)."""
    return float(confidence_tensor(root_log_probs, top_k))


class AdaptiveTreePlan(TreePlan):
    """A tree of depth `depth` and first-level width `width`, pruned by width decay and path-probability thresholds.

    Masked (`masked`: True, or None for accelerators only): every level is a fixed number of slots, so the draft
    runs `depth` levels whatever the thresholds leave.
    """

    def __init__(
        self,
        depth: int,
        width: float,
        max_nodes: int,
        top_k: int,
        threshold_scale: float,
        masked: bool | None = None,
    ):
        self.masked = masked
        self.depth = depth
        self._width = width
        self.max_nodes = max_nodes
        self.top_k = top_k
        self.threshold_scale = threshold_scale

    @property
    def width(self) -> float:
        return self._width

    def level_scale(self, level: int) -> float:
        """W_l's scale: W at the first level, W / l below (where W_l = W / l * (0.5 + P_parent), P_parent the
        parent's cumulative path probability)."""
        return self._width if level == 1 else self._width / level

    def max_children(self, level: int) -> int:
        """ceil(W) at the first level; below, W / l * (0.5 + P_parent) with P_parent at most 1."""
        bound = self._width if level == 1 else self._width / level * 1.5
        return min(self.top_k, math.ceil(bound))

    def threshold(self, level: int) -> float:
        """theta_l = c * l / D: deeper nodes need a more probable path."""
        return self.threshold_scale * level / self.depth

    def rule(self, levels: int) -> RowRule:
        """Ranks below W_l whose path probability exceeds theta_l."""
        floors = [math.log(theta) if theta > 0 else -math.inf for theta in map(self.threshold, range(1, levels + 1))]
        return RowRule(self.top_k, self.max_nodes, [self.level_scale(level) for level in range(1, levels + 1)], floors)


class SagePolicy(TreePolicy):
    """Entropy-adaptive trees: deep and narrow when the draft is confident, shallow and wide when not."""

    name = "sage"

    def __init__(self, config: SageConfig | None = None):
        self.config = config or SageConfig()
        self._initial = RankTreePlan(self.config.initial_tree)
        self.reset()

    def reset(self) -> None:
        self.alpha = self.config.initial_alpha
        self.depth_max = self.config.depth_max
        self.history: deque[int] = deque(maxlen=self.config.history_window)
        self._steps = 0
        self._planned_alpha: float | None = None

    @property
    def confidence(self) -> float | None:
        """The alpha the policy last planned a tree with (None before its first `plan` since `reset`)."""
        return self._planned_alpha

    def depth_for(self, alpha: float) -> int:
        """D(alpha) = D_min + alpha (D_max - D_min), rounded, with the history-adjusted D_max."""
        c = self.config
        return round(c.depth_min + alpha * (self.depth_max - c.depth_min))

    def width_for(self, alpha: float) -> float:
        """W(alpha) = W_min + (1 - alpha)(W_max - W_min)."""
        c = self.config
        return c.width_min + (1.0 - alpha) * (c.width_max - c.width_min)

    def plan(self) -> TreePlan:
        self._planned_alpha = self.alpha
        if self._steps == 0:
            return self._initial
        c = self.config
        return AdaptiveTreePlan(
            self.depth_for(self.alpha),
            self.width_for(self.alpha),
            c.max_nodes,
            c.top_k,
            c.threshold_scale,
            c.fixed_shapes,
        )

    def statistics(self, root_log_probs: torch.Tensor) -> torch.Tensor:
        return confidence_tensor(root_log_probs, self.config.top_k)[..., None]

    def observe(self, step: StepOutcome) -> StepLesson:
        """Take the step's root confidence as the next tree's alpha and its acceptance length into the history;
        returns the alpha it last planned a tree with (`confidence`: this step's, where `plan` planned it)."""
        self._steps += 1
        if step.statistics is None:
            self.alpha = confidence(step.root_log_probs, self.config.top_k)
        else:
            self.alpha = step.statistics[0]
        self.record_acceptance(step.accepted)
        return StepLesson(alpha=self.confidence)

    def record_acceptance(self, accepted: int) -> None:
        """Add one acceptance length; a full window with mean outside [low, high] moves D_max by one."""
        c = self.config
        self.history.append(accepted)
        if len(self.history) < c.history_window:
            return
        mean = sum(self.history) / len(self.history)
        if mean < c.history_low and self.depth_max > c.depth_max_floor:
            self.depth_max -= 1
            self.history.clear()
        elif mean > c.history_high and self.depth_max < c.depth_max_ceiling:
            self.depth_max += 1
            self.history.clear()
