"""Tree-shape policies behind one interface; `resolve_policy` turns a user's choice into a policy object."""

from __future__ import annotations

from .auto import AutoPolicy
from .base import BatchShape, RankTreePlan, StepLesson, StepOutcome, TreePlan, TreePolicy
from .chain import ChainPolicy
from .chain_length import ChainLength, ChainLengthConfig
from .confidence import ConfidenceConfig, ConfidencePolicy
from .draft_gate import DraftGateConfig
from .heterospec import HeteroSpecConfig, HeteroSpecPolicy
from .levels import LevelChoice, LevelRules, NodeMeasure, RowRule
from .path_bins import CALIBRATION_FILE, CalibrationError, PathEntropyBins
from .sage import AdaptiveTreePlan, SageConfig, SagePolicy
from .sage_gt import CostAwareTreePlan, SageGtConfig, SageGtPolicy
from .static import SPECVLM_TREE, StaticTreePolicy

POLICY_NAMES = ("auto", "chain", "static-tree", "sage", "sage-gt", "heterospec", "confidence")
_CONFIGS = {
    SageConfig: SagePolicy,
    SageGtConfig: SageGtPolicy,
    HeteroSpecConfig: HeteroSpecPolicy,
    ConfidenceConfig: ConfidencePolicy,
}
_NAMED = {"chain": ChainPolicy, "static-tree": StaticTreePolicy, "heterospec": HeteroSpecPolicy}
_NAMED |= {"confidence": ConfidencePolicy, "sage": SagePolicy, "sage-gt": SageGtPolicy, "auto": AutoPolicy}

PolicyChoice = str | SageConfig | SageGtConfig | HeteroSpecConfig | ConfidenceConfig | TreePolicy


def resolve_policy(policy: PolicyChoice) -> TreePolicy:
    """A policy object from a name (one of `POLICY_NAMES`), a config (`SageConfig`, `SageGtConfig`,
    `HeteroSpecConfig`, `ConfidenceConfig`), or a policy object."""
    if isinstance(policy, TreePolicy):
        return policy
    made = _CONFIGS.get(type(policy))
    if made is not None:
        return made(policy)
    if isinstance(policy, str) and policy in _NAMED:
        return _NAMED[policy]()
    raise ValueError(
        f"unknown policy {policy!r}; choose one of {', '.join(POLICY_NAMES)}, a SageConfig, SageGtConfig, "
        "HeteroSpecConfig or ConfidenceConfig, or a TreePolicy"
    )


__all__ = [
    "AutoPolicy",
    "CALIBRATION_FILE",
    "CalibrationError",
    "ConfidenceConfig",
    "ConfidencePolicy",
    "HeteroSpecConfig",
    "HeteroSpecPolicy",
    "NodeMeasure",
    "PathEntropyBins",
    "PolicyChoice",
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
