"""Tree-shape policies behind one interface; `resolve_policy` turns a user's choice into a policy object."""

from __future__ import annotations

from .auto import AutoPolicy
from .base import BatchShape, RankTreePlan, StepLesson, StepOutcome, TreePlan, TreePolicy
from .chain import ChainPolicy
from .chain_length import ChainLength, ChainLengthConfig
from .draft_gate import DraftGateConfig
from .levels import LevelChoice, LevelRules, RowRule
from .sage import AdaptiveTreePlan, SageConfig, SagePolicy
from .sage_gt import CostAwareTreePlan, SageGtConfig, SageGtPolicy
from .static import SPECVLM_TREE, StaticTreePolicy

POLICY_NAMES = ("auto", "chain", "static-tree", "sage", "sage-gt")


def resolve_policy(policy: str | SageConfig | SageGtConfig | TreePolicy) -> TreePolicy:
    """A policy object from a name (`auto`, `chain`, `static-tree`, `sage`, `sage-gt`), a config, or a policy object."""
    if isinstance(policy, TreePolicy):
        return policy
    if isinstance(policy, SageConfig):
        return SagePolicy(policy)
    if isinstance(policy, SageGtConfig):
        return SageGtPolicy(policy)
    if policy == "auto":
        return AutoPolicy()
    if policy == "chain":
        return ChainPolicy()
    if policy == "static-tree":
        return StaticTreePolicy()
    if policy == "sage":
        return SagePolicy()
    if policy == "sage-gt":
        return SageGtPolicy()
    raise ValueError(
        f"unknown policy {policy!r}; choose one of {', '.join(POLICY_NAMES)}, a SageConfig, a SageGtConfig or a "
        "TreePolicy"
    )


__all__ = [
    "AutoPolicy",
    "BatchShape",
    "AdaptiveTreePlan",
    "ChainLength",
    "ChainLengthConfig",
    "ChainPolicy",
    "CostAwareTreePlan",
    "DraftGateConfig",
    "LevelChoice",
    "LevelRules",
    "POLICY_NAMES",
    "RankTreePlan",
    "RowRule",
    "SPECVLM_TREE",
    "SageConfig",
    "SageGtConfig",
    "SageGtPolicy",
    "SagePolicy",
    "StepLesson",
    "StepOutcome",
    "StaticTreePolicy",
    "TreePlan",
    "TreePolicy",
    "resolve_policy",
]
