"""Chain drafting: one candidate per level, a fixed number of levels."""

from __future__ import annotations

from .base import RankTreePlan, TreePlan, TreePolicy


class ChainPolicy(TreePolicy):
    """A single path of `length` draft tokens, the classic speculative decoding draft."""

    name = "chain"

    def __init__(self, length: int = 5):
        if length < 1:
            raise ValueError(f"chain length must be at least 1, got {length}")
        self.length = length
        self._plan = RankTreePlan([[0] * d for d in range(1, length + 1)])

    def plan(self) -> TreePlan:
        return self._plan
