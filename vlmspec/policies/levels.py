"""Level rules: which of each frontier node's top-k draft children a tree keeps, for every row of a batch at once.

A plan states its rule as host numbers (`RowRule`, from `TreePlan.rule`): per level a width and a floor, whether
its scores are calibrated values (sage-gt) or path log-probabilities (SAGE), what a draft forward costs it, and,
for a fixed tree, the children it keeps. `LevelRules` holds every row's rule as tensors (one copy to the device a
step) and applies them to a level's candidates: the growth of the trees only asks it which candidates each row
drops, so one grower serves rows of any mix of plans.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..device_tensors import arange, host_tensor, host_values

if TYPE_CHECKING:
    from .base import TreePlan
    from .calibration import AcceptanceCalibration


@dataclass(frozen=True)
class NodeMeasure:
    """What a policy measures of each expanded node's draft distribution while the trees grow: `measure` maps the
    frontier's proposal log-probabilities (B, F, V) and their sorted top-k (B, F, k) to `width` values per node
    (B, F, width), written into the node's slot in the level that expands it (inside the level's compiled region where
    the pair runs compiled). A node the growth never expands (the deepest level's) keeps NaN. The trees carry the
    values (`Trees.node_statistics`), which the policy's `path_statistics` turns into its per-row numbers, read with
    the step's one packed read."""

    width: int
    measure: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def __deepcopy__(self, memo: dict) -> NodeMeasure:
        """The measure itself: it never changes, so a batch's row policies share it (and a compiled level's guards
        see one object)."""
        return self


@dataclass(frozen=True)
class _BothMeasures:
    """Two measures' values side by side (B, F, w1 + w2): `first`'s, then `second`'s."""

    first: NodeMeasure
    second: NodeMeasure

    def __call__(self, log_probs: torch.Tensor, top_log_probs: torch.Tensor) -> torch.Tensor:
        made = (self.first.measure(log_probs, top_log_probs), self.second.measure(log_probs, top_log_probs))
        return torch.cat(made, dim=-1)


@functools.cache
def joined_measure(first: NodeMeasure | None, second: NodeMeasure | None) -> NodeMeasure | None:
    """One measure taking both (either may be None): `first`'s values, then `second`'s (`split_measured` parts them).
    Made once per pair, so a compiled level sees one object step after step."""
    if first is None or second is None:
        return first if second is None else second
    return NodeMeasure(first.width + second.width, _BothMeasures(first, second))


def split_measured(
    values: torch.Tensor | None, first: NodeMeasure | None, second: NodeMeasure | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`joined_measure(first, second)`'s values (B, N, w1 + w2) parted: `first`'s (B, N, w1) and `second`'s first
    value (B, N) (views; None for a measure that is None)."""
    if values is None:
        return None, None
    width = 0 if first is None else first.width
    return (values[..., :width] if first is not None else None), (values[..., width] if second is not None else None)


@dataclass
class RowRule:
    """One row's level rule over `levels` levels, as host numbers.

    A candidate child of rank r under a parent of path probability P is dropped at level l when r is at least the
    width (`widths[l - 1]` at the first level, `widths[l - 1] * (0.5 + P)` below: SAGE's decay; inf for none) or its
    score is at most `floors[l - 1]` (-inf: none). Its score is its path log-probability, or, with a `calibration`,
    its calibrated acceptance times its parent's (sage-gt's value); `explore` keeps the first level's best child
    whatever its value. Such a row grows below a level only while the level's value times the calibration's
    continuation exceeds `forward_price[0] + forward_price[1] * nodes` (a plan without a price always grows).
    `keep` (for a fixed tree: per level a bool (F_l, k) mask over its frontier's top-k) replaces all of that: the
    row keeps exactly those children. Candidates at rank `top_k` or beyond are always dropped.
    """

    top_k: int
    max_nodes: int
    widths: list[float]
    floors: list[float]
    calibration: AcceptanceCalibration | None = None
    explore: bool = False
    forward_price: tuple[float, float] = (-math.inf, 0.0)
    keep: Sequence[torch.Tensor] | None = None


@dataclass
class LevelChoice:
    """A level's candidates (B, F, k each): their path log-probabilities (`cumulative`), the scores their rows rank
    them by, their calibrated values (None: no row has any) and which each row drops."""

    cumulative: torch.Tensor
    scores: torch.Tensor
    values: torch.Tensor | None
    drop: torch.Tensor


@dataclass
class LevelRules:
    """Every row's `RowRule` as tensors on the device: widths and floors (levels, B); node caps (inf for a fixed
    tree, whose mask is its cap) and how many levels the row may grow (`reach`), (B,) each; where some row is valued,
    its forward price (`price`, (2, B)), continuation (B,), whether its first child is judged by value (`judged`,
    (B,) bool: not exploring) and which calibration it uses (`calibrations` (B,): an index into the distinct ones, -1
    for none); where some row is fixed or of a smaller top-k, which rows judge (`free`, (B,) bool: not fixed), and
    whether some row is fixed (`fixed`, a host bool: a compiled level guards on it, not on the rules). Also
    the rows' largest top-k, its ranks as floats (k,), each row's own top-k (`top_ks`, (B,) float), and the host's
    rules."""

    rules: list[RowRule]
    top_k: int
    widths: torch.Tensor
    floors: torch.Tensor
    caps: torch.Tensor
    reach: torch.Tensor
    ranks: torch.Tensor
    top_ks: torch.Tensor
    price: torch.Tensor | None = None
    continuation: torch.Tensor | None = None
    judged: torch.Tensor | None = None
    calibrations: torch.Tensor | None = None
    free: torch.Tensor | None = None
    fixed: bool = False
    tables: list[tuple[AcceptanceCalibration, tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)
    measure: NodeMeasure | None = None

    @staticmethod
    def of(plans: Sequence[TreePlan], reach: list[int], device: torch.device) -> LevelRules:
        """The rules of `plans` (one a row), row b growing at most `reach[b]` levels, on `device`, copied there at
        once. The tables hold at least 2 levels, so that a compiled level's graph (which takes their count as a
        dynamic size, and 1 as a size of its own) serves every budget."""
        levels = max(2, *reach)
        rules = [plan.rule(levels) for plan in plans]
        rows, top_k = len(rules), max(rule.top_k for rule in rules)
        distinct = list({id(r.calibration): r.calibration for r in rules if r.calibration is not None}.values())
        values = [rule.widths[level] for level in range(levels) for rule in rules]
        values += [rule.floors[level] for level in range(levels) for rule in rules]
        # A fixed tree's mask is its cap (a cut by score would drop its children the warpers cut, of score -inf).
        values += [math.inf if rule.keep is not None else rule.max_nodes for rule in rules] + list(reach)
        values += [rule.top_k for rule in rules]
        if distinct:
            values += [rule.forward_price[0] for rule in rules] + [rule.forward_price[1] for rule in rules]
            values += [0.0 if rule.calibration is None else rule.calibration.continuation for rule in rules]
            values += [float(not rule.explore) for rule in rules]
            values += [_index(distinct, rule.calibration) for rule in rules]
        shaped = any(rule.keep is not None or rule.top_k < top_k for rule in rules)
        if shaped:
            values += [float(rule.keep is None) for rule in rules]
        held = host_values(values, device, torch.float32)
        table, tail = held[: 2 * levels * rows].view(2, levels, rows), held[2 * levels * rows :].view(-1, rows)
        ranks = arange(top_k, device).float()
        made = LevelRules(rules, top_k, table[0], table[1], tail[0], tail[1], ranks, tail[2])
        if distinct:
            made.price, made.continuation, made.judged, made.calibrations = tail[3:5], tail[5], tail[6] > 0, tail[7]
            made.tables = [(calibration, calibration.table(device)) for calibration in distinct]
        if shaped:
            made.free = tail[-1] > 0
        made.fixed = any(rule.keep is not None for rule in rules)
        made.measure = next((plan.node_measure for plan in plans if plan.node_measure is not None), None)
        return made

    @property
    def valued(self) -> bool:
        """Whether some row scores its children by calibrated value (then its frontier's values are carried)."""
        return self.price is not None

    def select(
        self,
        level: int,
        parent_log_probs: torch.Tensor,
        parent_values: torch.Tensor | None,
        top_log_probs: torch.Tensor,
        left: torch.Tensor | None = None,
        kept: torch.Tensor | None = None,
    ) -> LevelChoice:
        """Which of the frontier's top-k candidates each row drops at `level` (1-based), from the frontier's path
        log-probabilities and values (B, F; values None at the first level, whose parent is the root, worth 1) and
        the candidates' own log-probabilities `top_log_probs` (B, F, k), sorted. `left` (B,) is how many nodes each
        row may still add (None: its cap cannot bind); a row keeps its best-scoring candidates within it. `kept` is
        `kept(level, F)` where some row is fixed (made here when not given); otherwise each row's ranks past its own
        top-k are dropped on the device, and always when compiled (a no-op where every row's top-k is the largest),
        so that one graph serves rows of one top-k and of several."""
        scale, floor = _at_level(self.widths, level)[:, None], _at_level(self.floors, level)[:, None, None]
        width = scale if level == 1 else (parent_log_probs.exp() + 0.5) * scale
        # The root's path log-probability is 0.
        cumulative = top_log_probs if level == 1 else parent_log_probs[:, :, None] + top_log_probs
        values = self._values(level, top_log_probs, parent_values) if self.valued else None
        scores = cumulative if values is None else self._scores(cumulative, values)
        drop = (self.ranks >= width[:, :, None]) | (scores <= floor)
        if values is not None and level == 1:
            drop[:, 0, 0] &= self.judged
        if self.fixed:
            kept = self.kept(level, drop.shape[1], drop.device) if kept is None else kept
            drop = (drop & self.free[:, None, None]) | ~kept
        elif torch.compiler.is_compiling() or self.free is not None:
            drop |= self.ranks >= self.top_ks[:, None, None]
        if left is not None:
            drop |= _past_cap(scores, drop, left)
        return LevelChoice(cumulative, scores, values, drop)

    def pays(self, choice: LevelChoice, kept: torch.Tensor) -> torch.Tensor:
        """Whether each row's level, of `kept` (B,) nodes, pays for a draft forward over it: its kept candidates'
        value times the chance a path goes on exceeds the forward's price (always, for a row without one)."""
        gain = choice.values.flatten(1).masked_fill(choice.drop.flatten(1), 0.0).sum(1) * self.continuation
        return gain > self.price[0] + self.price[1] * kept

    def _values(self, level: int, top_log_probs: torch.Tensor, parent_values: torch.Tensor | None) -> torch.Tensor:
        """sage-gt's values of the candidates (B, F, k): each calibrated acceptance times its parent's value (by its
        row's own calibration where the rows' differ)."""
        calibration, table = self.tables[0]
        values = calibration.rate(top_log_probs, table)
        for index, (calibration, table) in enumerate(self.tables[1:], start=1):
            own = (self.calibrations == index)[:, None, None]
            values = torch.where(own, calibration.rate(top_log_probs, table), values)
        return values if level == 1 else values * parent_values[:, :, None]

    def _scores(self, cumulative: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Each row's scores: its values where it is valued, else its path log-probabilities."""
        if all(rule.calibration is not None for rule in self.rules):
            return values
        return torch.where((self.calibrations >= 0)[:, None, None], values, cumulative)

    def kept(self, level: int, frontier: int, device: torch.device) -> torch.Tensor:
        """(B, F, k) bool: each fixed row's mask of `level` over its first frontier slots (none past them), every
        other row's ranks below its own top-k; made on the host, copied without a wait."""
        kept = torch.zeros(len(self.rules), frontier, self.top_k, dtype=torch.bool)
        for b, rule in enumerate(self.rules):
            if rule.keep is None:
                kept[b, :, : rule.top_k] = True
            elif level <= len(rule.keep):
                # A frontier smaller than the tree's level is one the row's reach cut (it keeps nothing here).
                mask = rule.keep[level - 1][:frontier]
                kept[b, : mask.shape[0], : mask.shape[1]] = mask
        return host_tensor(kept, device)


def _at_level(table: torch.Tensor, level: int) -> torch.Tensor:
    """Row `level - 1` of `table` (levels, B): a view when eager; compiled, selected by comparison with the level
    (exact: every other level's entry is replaced, not added), so that a graph takes the level as a dynamic number
    rather than compiling once per level."""
    if not torch.compiler.is_compiling():
        return table[level - 1]
    levels = torch.arange(table.shape[0], device=table.device)[:, None]
    return torch.where(levels == level - 1, table, 0.0).sum(0)


def _index(distinct: list[AcceptanceCalibration], calibration: AcceptanceCalibration | None) -> float:
    """The index of `calibration` among the `distinct` ones (-1 for none)."""
    return -1.0 if calibration is None else float(next(i for i, c in enumerate(distinct) if c is calibration))


def _past_cap(scores: torch.Tensor, drop: torch.Tensor, left: torch.Tensor) -> torch.Tensor:
    """(B, F, k) bool: the candidates each row keeps beyond its best `left` (B,) by score."""
    rows = scores.shape[0]
    order = scores.masked_fill(drop, -torch.inf).flatten(1).argsort(dim=1, descending=True, stable=True)
    positions = arange(order.shape[1], order.device).expand(rows, -1)
    rank = torch.empty_like(order).scatter_(1, order, positions)
    return (rank >= left[:, None]).view_as(drop)
