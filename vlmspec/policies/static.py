"""A fixed draft tree: the same shape at every step (SpecVLM's static baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import RankTreePlan, TreePlan, TreePolicy

#: The 25-node, depth-5 tree used by SpecVLM and as SAGE's initial tree, as paths of child ranks below the root.
SPECVLM_TREE: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (2, 0),
    (2, 1),
    (3, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 1, 1),
    (0, 2, 0),
    (0, 2, 1),
    (1, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 0, 2),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
)


class StaticTreePolicy(TreePolicy):
    """Always drafts the same tree (`paths` of child ranks; default the SpecVLM tree)."""

    name = "static-tree"

    def __init__(self, paths: Sequence[Sequence[int]] = SPECVLM_TREE):
        self._plan = RankTreePlan(paths)

    def plan(self) -> TreePlan:
        return self._plan
