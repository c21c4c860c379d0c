"""SAGE x GT: SAGE's entropy-shaped trees, sized by measured cost to maximise accepted tokens per second.

SAGE's confidence alpha sets the width and its per-level width decay, as in `sage`. Depth and node count are no
longer fixed numbers: a node enters the tree only while its expected acceptance (the draft's path probabilities,
calibrated online against what the target accepted) is worth its measured cost at the rate the policy achieves,
and the draft grows another level only while that level's expected acceptance pays for the draft forward. This is
the GT principle with the achieved rate lambda (tokens per second) as the price of time: maximising
`tokens - lambda * seconds` per step with lambda the best rate so far is how a ratio is maximised (Dinkelbach).
Costs come from a `CostModel` fitted to this run's own steps; nothing is tuned to a device.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .base import RankTreePlan, StepLesson, StepOutcome, TreePlan, TreePolicy
from .calibration import AcceptanceCalibration
from .cost_model import CostModel, StepCost
from .levels import RowRule
from .sage import AdaptiveTreePlan, SageConfig, SagePolicy


@dataclass
class SageGtConfig:
    """Every number of the `sage-gt` policy.

    `sage` shapes the trees (top-k, widths, the first tree of each call) and plans them alone until the cost model
    has `warmup_steps` observations. `max_depth` and `max_nodes` only bound the buffers: the cost decides the
    size, down to the root alone (plain decoding) when no child is worth its cost; every `explore_every`-th step
    then still proposes the draft's first guess, so the calibration sees whether the draft has become worth it.
    `sage.fixed_shapes` decides here too whether levels are masked slots (see `CostAwareTreePlan`).
    Costs are fitted over the last `cost_window` steps, the achieved rate over the last `rate_window`;
    `calibration_*` set the acceptance calibration's bins, prior weight and memory (in trees).
    """

    sage: SageConfig = field(default_factory=SageConfig)
    max_depth: int = 16
    max_nodes: int = 64
    warmup_steps: int = 4
    explore_every: int = 8
    cost_window: int = 64
    cost_ridge: float = 1e-3
    rate_window: int = 32
    calibration_bins: int = 20
    calibration_prior: float = 4.0
    calibration_memory: float = 200.0

    def __post_init__(self):
        if self.max_depth < 1 or self.max_nodes < 1:
            raise ValueError(f"max_depth and max_nodes must be positive, got {self.max_depth}, {self.max_nodes}")
        if min(self.warmup_steps, self.explore_every, self.cost_window, self.rate_window, self.calibration_bins) < 1:
            raise ValueError(
                "warmup_steps, explore_every, cost_window, rate_window and calibration_bins must be positive"
            )
        if self.warmup_steps > self.cost_window:
            raise ValueError("warmup_steps cannot exceed cost_window")


class CostAwareTreePlan(AdaptiveTreePlan):
    """SAGE's candidate children at each level, kept while worth their cost; levels grow while they pay.

    A candidate's value is its calibrated path acceptance. It is kept when that exceeds `node_floor` (tokens the
    node's time could have produced at the achieved rate); with `explore`, the best first-level child is kept
    whatever its value. A level is drafted below the current one when the current level's value times the
    chance that a path goes on exceeds `forward_floor[0] + forward_floor[1] * nodes`, the tokens a draft forward
    over them costs. Unmasked, whether a level pays is read from the device level by level. Masked (`masked`: True,
    or None for accelerators only), the levels are fixed numbers of slots, the rejected children masked, and the
    draft grows `paying_levels` levels: as deep as the previous tree's levels paid, one deeper when all did (the
    host knows that tree from the step's one read), so drafting never waits for the device.
    """

    def __init__(
        self,
        width: float,
        max_depth: int,
        max_nodes: int,
        top_k: int,
        calibration: AcceptanceCalibration,
        node_floor: float,
        forward_floor: tuple[float, float],
        explore: bool = False,
        masked: bool | None = False,
        paying_levels: int | None = None,
    ):
        super().__init__(max_depth, width, max_nodes, top_k, threshold_scale=0.0, masked=masked)
        self.paying_levels = max_depth if paying_levels is None else max(1, min(paying_levels, max_depth))
        self.calibration = calibration
        self.node_floor = node_floor
        self.forward_floor = forward_floor
        self.explore = explore

    def rule(self, levels: int) -> RowRule:
        """SAGE's widths; a child's floor is the node price, its score its calibrated value."""
        return RowRule(
            self.top_k,
            self.max_nodes,
            [self.level_scale(level) for level in range(1, levels + 1)],
            [self.node_floor] * levels,
            calibration=self.calibration,
            explore=self.explore,
            forward_price=self.forward_floor,
        )

    def levels(self, masked: bool) -> int:
        return self.paying_levels if masked else self.depth


def _value_at(values: list[float], n: int, cap: int) -> float:
    """The value of a row's (n+1)-th best node, from its last tree's `values` (best first) cut at most at `cap`
    nodes: past a tree the cap cut, its last value again; past one that ended on its own, 0."""
    if n < len(values):
        return values[n]
    return values[-1] if values and len(values) >= cap else 0.0


class RateWindow:
    """Tokens per second over the last `window` steps."""

    def __init__(self, window: int):
        self.window = window
        self._steps: deque[tuple[int, float]] = deque()
        self._tokens = 0
        self._seconds = 0.0

    @property
    def rate(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 else None

    def add(self, tokens: int, seconds: float) -> None:
        """Add a step, dropping the oldest beyond the window."""
        self._steps.append((tokens, seconds))
        self._tokens += tokens
        self._seconds += seconds
        if len(self._steps) > self.window:
            old_tokens, old_seconds = self._steps.popleft()
            self._tokens -= old_tokens
            self._seconds -= old_seconds


@dataclass
class SageGtShared:
    """What the rows of a pair learn together and keep across calls: the cost model, the acceptance calibration and
    the achieved rate (observed once per step, by the step's first row), and the node cap the batch's last step set
    (None before one, or when a step had one row)."""

    cost: CostModel
    calibration: AcceptanceCalibration
    rates: RateWindow
    cap: int | None = None


@dataclass
class SageGtRowState:
    """What one sequence's policy carries from a step to its next: whether a step of this call has been observed,
    how many steps it has seen (for exploring), the cache lengths the next step starts from, how many rows its last
    step shared the batch with, and its last tree's parents and cumulative draft log-probabilities (root first)."""

    first_step: bool = True
    steps: int = 0
    contexts: tuple[int, int] = (0, 0)
    rows: int = 1
    last_tree: tuple[list[int], list[float]] | None = None


class SageGtPolicy(TreePolicy):
    """SAGE's trees sized by measured cost; what it learns (`shared`: costs, calibration, rate) outlives each call,
    what a sequence carries between its steps is its `state`."""

    name = "sage-gt"
    reads_tree = True

    def __init__(self, config: SageGtConfig | None = None):
        self.config = config or SageGtConfig()
        c = self.config
        self.sage = SagePolicy(c.sage)
        self.shared = SageGtShared(
            CostModel(c.cost_window, c.cost_ridge),
            AcceptanceCalibration(c.calibration_bins, c.calibration_prior, c.calibration_memory),
            RateWindow(c.rate_window),
        )
        self.state = SageGtRowState()

    @property
    def cost(self) -> CostModel:
        return self.shared.cost

    @property
    def calibration(self) -> AcceptanceCalibration:
        return self.shared.calibration

    @property
    def rates(self) -> RateWindow:
        return self.shared.rates

    def reset(self) -> None:
        self.sage.reset()
        self.state.first_step = True

    def for_row(self) -> SageGtPolicy:
        """A row's policy: its own SAGE state and row state; what the policy learns (`shared`) is the batch's, shared
        with every row and kept across calls. In a batch a node costs what one more token of the whole batch's
        verification costs, at the batch's rate, and a draft forward's fixed cost is shared by the rows it serves: as
        the batch fills and its forwards turn compute-bound, trees shrink, down to plain decoding."""
        row = SageGtPolicy(self.config)
        row.shared = self.shared
        return row

    @property
    def rate(self) -> float | None:
        """Tokens per second over the recent steps (None before the first)."""
        return self.rates.rate

    @property
    def ready(self) -> bool:
        """Whether the cost model has seen enough steps to size trees."""
        return self.cost.observations >= self.config.warmup_steps and self.rate is not None

    def statistics(self, root_log_probs: torch.Tensor) -> torch.Tensor:
        return self.sage.statistics(root_log_probs)

    def plan(self) -> TreePlan:
        sage_plan = self.sage.plan()
        state = self.state
        if state.first_step or not self.ready:
            return sage_plan
        c = self.config
        rate = self.rate
        target_context, draft_context = state.contexts
        fixed, per_node = self.cost.forward_seconds(draft_context)
        # One draft forward serves every row of a batch: each row's level pays its share of the forward.
        forward_floor = (rate * fixed / state.rows, rate * per_node)
        return CostAwareTreePlan(
            self.sage.width_for(self.sage.alpha),
            c.max_depth,
            c.max_nodes,
            c.sage.top_k,
            self.calibration,
            node_floor=rate * self.cost.node_seconds(target_context, draft_context),
            forward_floor=forward_floor,
            explore=state.steps % c.explore_every == 0,
            masked=c.sage.fixed_shapes,
            paying_levels=self.paying_levels(forward_floor),
        )

    def plan_batch(self, rows: Sequence[TreePolicy], timed: bool = True) -> list[TreePlan]:
        """Each row's tree, all capped at one node count: the verification carries every row's tree padded to the
        largest, so one more node in the largest tree costs a token in every row. The cap is the largest n at which
        the rows' n-th most valuable nodes (calibrated, from their last trees) are worth, on average, what a token
        of the batch's verification costs. Past its own tree's end a row counts 0, unless the last cap cut its tree:
        then it counts its last node's value again, up to twice that cap, so the cap grows back while it pays. A row
        just admitted starts from the first levels of SAGE's first tree. Sizing by measured cost is the policy itself,
        so it does so under `timed` False too: a seeded sampled batch's draws then follow the machine's speed."""
        plans = [row.plan() for row in rows]
        known = [
            (plan, row.state.last_tree)
            for plan, row in zip(plans, rows, strict=True)
            if isinstance(plan, CostAwareTreePlan) and isinstance(row, SageGtPolicy) and row.state.last_tree is not None
        ]
        shared = self.shared
        if len(plans) < 2 or not known:
            shared.cap = None
            return plans
        price = sum(plan.node_floor for plan, _ in known) / len(known)
        values = [sorted(self.calibration.node_values(*tree)[1:], reverse=True) for _, tree in known]
        last_cap = max(len(v) for v in values) if shared.cap is None else shared.cap
        limit = 2 * last_cap + 1
        cap = 0
        while cap < limit and sum(_value_at(v, cap, last_cap) for v in values) > price * len(values):
            cap += 1
        shared.cap = cap
        for b, plan in enumerate(plans):
            if isinstance(plan, CostAwareTreePlan):
                plan.max_nodes = min(plan.max_nodes, max(cap, int(plan.explore)))
            elif isinstance(plan, RankTreePlan) and plan.max_nodes > cap:
                plans[b] = RankTreePlan(plan.paths[: max(cap, 1)])
        return plans

    def paying_levels(self, forward_floor: tuple[float, float]) -> int:
        """How many levels a masked plan grows: 1 + the run of the last tree's levels from the first on whose
        calibrated value, times the chance a path goes on, paid for a draft forward over them (`grows`' rule on
        the host's copy of that tree)."""
        if self.state.last_tree is None:
            return self.config.max_depth
        parents, log_probs = self.state.last_tree
        values = self.calibration.node_values(parents, log_probs)
        depths = [0] * len(parents)
        sums: dict[int, list[float]] = {}
        for node in range(1, len(parents)):
            depths[node] = depths[parents[node]] + 1
            level = sums.setdefault(depths[node], [0.0, 0])
            level[0] += values[node]
            level[1] += 1
        fixed, per_node = forward_floor
        paying = 0
        while paying + 1 in sums:
            value, count = sums[paying + 1]
            if value * self.calibration.continuation <= fixed + per_node * count:
                break
            paying += 1
        return paying + 1

    def observe(self, step: StepOutcome) -> StepLesson:
        """Fit the step's measured cost, rate and acceptance into what the rows share, and carry the row's state on;
        returns SAGE's planned alpha and, once the cost model is warm, what the step's tree was predicted to emit and
        cost (predicted before the step's own cost and acceptance enter the models)."""
        tree, batch = step.tree, step.batch
        measured = StepCost(
            tree_tokens=tree.size if batch is None else batch.tree_tokens,
            target_context=step.target_context if batch is None else batch.target_context,
            draft_forwards=step.draft_forwards if batch is None else batch.draft_forwards,
            draft_tokens=step.draft_tokens if batch is None else batch.draft_tokens,
            draft_context=step.draft_context if batch is None else batch.draft_context,
            verify_seconds=step.verify_seconds,
            draft_seconds=step.draft_seconds,
        )
        parents = tree.parents.tolist() if step.tree_parents is None else step.tree_parents
        log_probs = tree.log_probs.tolist() if step.tree_log_probs is None else step.tree_log_probs
        state = self.state
        state.last_tree = (parents, log_probs)
        tokens: float | None = None
        seconds: float | None = None
        if self.ready:
            tokens = 1.0 + self.calibration.expected_accepted(parents, log_probs)
            seconds = self.cost.predict(measured)
        if batch is None or batch.first:
            self.cost.add(measured)
            self.rates.add(step.accepted + 1 if batch is None else batch.emitted, step.seconds)
        self.calibration.observe(parents, log_probs, step.path)
        state.contexts = (step.target_context + step.accepted + 1, step.draft_context + step.accepted + 1)
        state.rows = 1 if batch is None else batch.rows
        state.first_step = False
        state.steps += 1
        return StepLesson(self.sage.observe(step).alpha, tokens, seconds)
