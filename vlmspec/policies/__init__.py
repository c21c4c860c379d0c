"""Tree-shape policies behind one interface; `resolve_policy` turns a user's choice into a policy object."""

from __future__ import annotations

from .base import RankTreePlan, TreePlan, TreePolicy
from .chain import ChainPolicy
from .sage import AdaptiveTreePlan, SageConfig, SagePolicy
from .static import SPECVLM_TREE, StaticTreePolicy

POLICY_NAMES = ("chain", "static-tree", "sage")


def resolve_policy(policy: str | SageConfig | TreePolicy) -> TreePolicy:
    """A policy object from a name (`chain`, `static-tree`, `sage`), a `SageConfig`, or a policy object."""
    if isinstance(policy, TreePolicy):
        return policy
    if isinstance(policy, SageConfig):
        return SagePolicy(policy)
    if policy == "chain":
        return ChainPolicy()
    if policy == "static-tree":
        return StaticTreePolicy()
    if policy == "sage":
        return SagePolicy()
    raise ValueError(
        f"unknown policy {policy!r}; choose one of {', '.join(POLICY_NAMES)}, a SageConfig or a TreePolicy"
    )


__all__ = [
    "AdaptiveTreePlan",
    "ChainPolicy",
    "POLICY_NAMES",
    "RankTreePlan",
    "SPECVLM_TREE",
    "SageConfig",
    "SagePolicy",
    "StaticTreePolicy",
    "TreePlan",
    "TreePolicy",
    "resolve_policy",
]
