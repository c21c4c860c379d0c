"""The policy interface: a policy plans the shape of the next draft tree and learns from each step.

A `TreePlan` states its level rule (`RowRule`): which of the top-k children of each frontier node to add, by
widths and floors on the draft's probabilities (SAGE thresholds, sage-gt's values) or as a fixed set of rank paths
(chain, static tree). The draft engine applies every row's rule at once, level by level (`LevelRules`). A new
policy is one file implementing `TreePolicy`.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .draft_gate import LAST_TOKEN
from .levels import NodeMeasure, RowRule

if TYPE_CHECKING:
    from ..engine.tree import Tree, Trees


class TreePlan(ABC):
    """How to grow one tree: its maximum depth, node budget, candidates per node and its level rule.

    The rule (`rule`) says, as numbers the growth holds per row as tensors, which of each frontier node's top-k
    children to keep at each level: widths, floors on a child's score, a forward's price, or a fixed tree's children
    (`RowRule`). A `masked` growth grows every level as a fixed number of slots, the children a rule rejects masked
    rather than removed, so growing the tree never waits for the device. None means masked on accelerators only,
    where a read waits for the device; a batch's rows grow as its first plan that says asks. `paths` are the rank
    paths of a fixed tree (None for a tree that depends on the draft's probabilities): rows that all draft one such
    tree grow it without gathers. `node_measure` (None: none) is what the policy measures of each expanded node's
    draft distribution as the tree grows (`NodeMeasure`).
    """

    depth: int
    max_nodes: int
    top_k: int
    masked: bool | None = None
    paths: list[tuple[int, ...]] | None = None
    node_measure: NodeMeasure | None = None

    @abstractmethod
    def rule(self, levels: int) -> RowRule:
        """The plan's level rule over its first `levels` levels (1-based levels, `levels` at least as deep as the
        tree grows)."""

    def levels(self, masked: bool) -> int:
        """How many levels to grow: `depth`, the most a plan may grow unmasked (where its forward price can stop it
        early)."""
        return self.depth

    def max_children(self, level: int) -> int:
        """The most children one node can get at `level` (a bound on the host, for sizing masked levels)."""
        return self.top_k

    @property
    def width(self) -> float:
        """Width of the first level (for stats)."""
        return float(self.top_k)


class RankTreePlan(TreePlan):
    """A fixed tree given as paths of child ranks below the root, e.g. `[[0], [1], [0, 0]]` (`node_measure`: what
    its policy measures of each expanded node, `TreePlan`)."""

    def __init__(self, paths: Sequence[Sequence[int]], node_measure: NodeMeasure | None = None):
        self.node_measure = node_measure
        paths = [tuple(p) for p in paths]
        if not paths:
            raise ValueError("a tree needs at least one path")
        known = set(paths)
        for p in paths:
            if not p or min(p) < 0:
                raise ValueError(f"invalid rank path {list(p)}")
            if len(p) > 1 and p[:-1] not in known:
                raise ValueError(f"rank path {list(p)} has no parent path {list(p[:-1])} in the tree")
        self.paths = sorted(known, key=lambda p: (len(p), p))
        self.depth = max(len(p) for p in self.paths)
        self.max_nodes = len(self.paths)
        self.top_k = max(max(p) for p in self.paths) + 1
        self._masks: list[torch.Tensor] = []
        frontier: list[tuple[int, ...]] = [()]
        for _ in range(self.depth):
            mask = torch.zeros(len(frontier), self.top_k, dtype=torch.bool)
            children = []
            for row, parent in enumerate(frontier):
                for rank in range(self.top_k):
                    if parent + (rank,) in known:
                        mask[row, rank] = True
                        children.append(parent + (rank,))
            self._masks.append(mask)
            frontier = children
        self._most_children = [int(mask.sum(1).max()) for mask in self._masks]
        self._width = float(sum(len(p) == 1 for p in self.paths))

    def __deepcopy__(self, memo: dict) -> RankTreePlan:
        """The plan itself: it never changes, so the copies of a policy made for a batch's rows share it."""
        return self

    @property
    def width(self) -> float:
        return self._width

    def max_children(self, level: int) -> int:
        return self._most_children[level - 1] if level <= self.depth else 0

    def rule(self, levels: int) -> RowRule:
        """Each level's children as the paths name them (`keep`: the level's (frontier node, rank) mask)."""
        return RowRule(self.top_k, self.max_nodes, [math.inf] * levels, [-math.inf] * levels, keep=self._masks[:levels])


@dataclass
class BatchShape:
    """What a step of many sequences decoded together fed the models and emitted, over all its rows.

    `tree_tokens` is what the verification forward carried (rows x the largest tree, padding included), the draft's
    `draft_forwards` carried `draft_tokens` (padding included); `emitted` tokens came out of the step, and contexts
    are the rows' mean cache lengths. `first` marks the step's first row: what the rows share is recorded once.
    """

    rows: int
    tree_tokens: int
    draft_forwards: int
    draft_tokens: int
    emitted: int
    target_context: int
    draft_context: int
    first: bool


@dataclass
class StepOutcome:
    """One finished draft-verify step, as a policy sees it.

    `tree` is the drafted tree (on the draft's device, with its cumulative draft path log-probabilities) and `path`
    the accepted node indices from the root on. Contexts are the cache lengths the tree was drafted and verified
    over; seconds are wall time (the whole step's, and its two model phases). `drafted` is False for a row that rode
    along in the step with its root alone, while other rows drafted (`TreePolicy.drafting`).

    The engine reads the step's results from the device once: `statistics` holds the values of the policy's
    `statistics()` for this step, then those of its `path_statistics()`, and, for a policy that `reads_tree`,
    `tree_parents` and `tree_log_probs` are the tree's on the host. Reading `root_log_probs` or `tree` instead makes
    the host wait for the device again. `sampled` says whether the row samples its tokens (fixed for the row's
    life): a gate that learns the pair's drafts from greedy rows alone needs it (`RowGate.observe`).
    """

    root_log_probs: torch.Tensor
    accepted: int
    tree: Tree
    path: Sequence[int] | torch.Tensor
    draft_forwards: int
    draft_tokens: int
    draft_context: int
    target_context: int
    draft_seconds: float
    verify_seconds: float
    seconds: float
    statistics: list[float] | None = None
    tree_parents: list[int] | None = None
    tree_log_probs: list[float] | None = None
    batch: BatchShape | None = None
    drafted: bool = True
    sampled: bool = False


@dataclass(frozen=True)
class StepLesson:
    """What a policy's `observe` hands back about the step it learned from, for the step's record (`StepRecord`).

    `alpha` is the draft's root confidence the policy last planned a tree with (`plan`: SAGE's alpha, measured at the
    previous step's root), so for a step planned alone the alpha of the step's own tree; None for a policy without
    one, or one that has not planned alone since its reset (a batch's rows planned together). A policy that
    predicts its steps gives what it expected of this step's tree before the target verified it: `predicted_tokens`
    emitted (accepted + 1) and `predicted_seconds` of drafting + verification, both or neither (None before its cost
    model is warm, or for a policy that does not predict). Returned rather than left on the policy for the engine to
    read, so the step's state travels explicitly.
    """

    alpha: float | None = None
    predicted_tokens: float | None = None
    predicted_seconds: float | None = None


class TreePolicy(ABC):
    """Plans each step's tree and observes the outcome, handing back what the step's record keeps (`StepLesson`)."""

    name: str = "policy"
    #: Whether `observe` needs the tree's parents and log-probabilities on the host (read with the step's results).
    reads_tree: bool = False

    def reset(self) -> None:
        """Forget everything learned before: called at the start of every continuation a `generate` call draws."""

    def bind(self, target: torch.nn.Module, draft: torch.nn.Module) -> None:
        """Take, or check, what the policy knows of the pair it decodes for (when a `SpeculativeVLM` is made): by
        default nothing; a policy calibrated offline refuses a calibration fitted to another pair."""

    def for_row(self) -> TreePolicy:
        """The policy of one sequence in a batch: its own per-sequence state, fresh (by default a reset copy); a
        policy that learns about the pair or the device shares that with the other rows."""
        own = copy.deepcopy(self)
        own.reset()
        return own

    @abstractmethod
    def plan(self) -> TreePlan:
        """The tree for the next step."""

    def plan_batch(self, rows: Sequence[TreePolicy], timed: bool = True) -> list[TreePlan]:
        """The trees for the next step of a batch whose rows decode under `rows` (this policy's `for_row` copies):
        by default each row plans alone; a policy that prices the batch's shared verification sizes them together.
        With `timed` False (a row samples, and its seeded draws follow the trees' shapes) a policy that would follow
        measured time plans what it would without a clock, where it can."""
        return [row.plan() for row in rows]

    def statistics(self, root_log_probs: torch.Tensor) -> torch.Tensor | None:
        """Values (a 1-D float tensor, on the device) the policy needs from a step's root distribution, read with
        the step's results and handed back as `StepOutcome.statistics`; None for none. A function of the distribution
        alone, over any leading dimensions: `root_log_probs` (B, V) of a batch's rows gives (B, values). Where the
        pair runs compiled it is compiled with the step (`fullgraph=True`), so it reads nothing to the host."""
        return None

    def path_statistics(self, trees: Trees) -> torch.Tensor | None:
        """Values (B, s) the policy needs from a step's grown trees, beside `statistics`' (after them in
        `StepOutcome.statistics`): a function of the trees' tensors alone (their `node_statistics`, the values the
        plan's `node_measure` took, None where a step grew none), taken where the step's acceptance runs, so read with
        its results; None for none (the default)."""
        return None

    def observe(self, step: StepOutcome) -> StepLesson:
        """Learn from a finished step (the draft's log-probabilities are under the generation config's processing,
        -inf where its warpers cut a token) and return what the step's record keeps of it: by default nothing (no
        confidence, no prediction)."""
        return StepLesson()

    def drafting(self, rows: Sequence[TreePolicy], sampling: Sequence[bool], rooms: Sequence[int]) -> list[str | None]:
        """Per row of the next step (decoded under `rows`, this policy's `for_row` copies; `sampling` whether each
        samples, `rooms` the tokens each may still emit): None where it drafts, else why it takes the target's next
        token alone. A row with one token left never drafts; a policy that weighs what drafting costs stops more."""
        return [None if room > 1 else LAST_TOKEN for room in rooms]

    def observe_plain(self, rows: Sequence[TreePolicy], reasons: Sequence[str | None], seconds: float) -> None:
        """A step in which no row drafted (`reasons`, as `drafting` gave them) took `seconds`."""
