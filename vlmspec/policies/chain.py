"""Chain drafting: one candidate per level, a fixed number of levels."""

from __future__ import annotations

from functools import cache

from .base import RankTreePlan, TreePlan, TreePolicy
from .levels import NodeMeasure


@cache
def chain_plan(length: int, node_measure: NodeMeasure | None = None) -> RankTreePlan:
    """The chain of `length` draft tokens, its expanded nodes measured by `node_measure` (None: not measured): one
    plan per length and measure, shared (a rank tree never changes)."""
    return RankTreePlan([[0] * d for d in range(1, length + 1)], node_measure=node_measure)


class ChainPolicy(TreePolicy):
    """A single path of `length` draft tokens, the classic speculative decoding draft."""

    name = "chain"

    def __init__(self, length: int = 5):
        if length < 1:
            raise ValueError(f"chain length must be at least 1, got {length}")
        self.length = length
        self._plan = chain_plan(length)

    def plan(self) -> TreePlan:
        return self._plan
