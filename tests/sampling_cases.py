"""What the sampling tests share: the family, the settings, the target's exact distributions (enumerated once per
process) and the G test of SpeculativeVLM's samples against them."""

from __future__ import annotations

from functools import cache

import torch
from conftest import FAMILIES

from vlmspec import SageGtConfig, SpecStats, SpeculativeVLM, TreePolicy
from vlmspec.testing.distribution import GTest, continuations, eos_ids, exact_continuations, g_test

SAMPLES = 2000
NEW_TOKENS = 6
ALPHA = 1e-3
WARPS = {
    "temperature": dict(temperature=0.7, top_k=0),
    "top_k_top_p": dict(temperature=1.5, top_k=4, top_p=0.9),
}
#: Prefixes less likely than this stand for all their continuations (temperature alone keeps the whole vocabulary).
MIN_MASS = {"temperature": 0.02, "top_k_top_p": 0.005}
FAMILY = FAMILIES["qwen2_5_vl"]


@cache
def exact(case: str, warp: str) -> dict[tuple[int, ...], float]:
    return exact_continuations(FAMILY.target, FAMILY.cases[case], NEW_TOKENS, MIN_MASS[warp], **WARPS[warp])


def speculative_test(
    policy: str | SageGtConfig | TreePolicy, draft: str | torch.nn.Module, case: str, warp: str, samples: int = SAMPLES
) -> tuple[GTest, SpecStats]:
    """G test of `samples` continuations drawn by SpeculativeVLM (from one prefill, decoded together) against the exact
    distribution; `draft` names one of the family's drafts, or is a drafter (a head)."""
    inputs = FAMILY.cases[case]
    drafter = FAMILY.drafts[draft] if isinstance(draft, str) else draft
    spec = SpeculativeVLM(FAMILY.target, drafter, policy=policy)
    sequences = spec.generate(
        **inputs,
        do_sample=True,
        max_new_tokens=NEW_TOKENS,
        num_return_sequences=samples,
        generator=torch.Generator().manual_seed(0),
        **WARPS[warp],
    )
    samples = continuations(sequences, inputs["input_ids"].shape[1], eos_ids(FAMILY.target, {}))
    return g_test(samples, exact(case, warp)), spec.last_stats


def alone_test(policy: str, draft: str, case: str, warp: str) -> tuple[GTest, list[SpecStats]]:
    """G test of SAMPLES continuations each drawn by a call of its own (the one-sequence decoder), from one generator,
    against the exact distribution; returns each call's statistics too."""
    inputs = FAMILY.cases[case]
    spec = SpeculativeVLM(FAMILY.target, FAMILY.drafts[draft], policy=policy)
    generator = torch.Generator().manual_seed(0)
    samples, stats = [], []
    for _ in range(SAMPLES):
        sequence = spec.generate(
            **inputs, do_sample=True, max_new_tokens=NEW_TOKENS, generator=generator, **WARPS[warp]
        )
        samples += continuations(sequence, inputs["input_ids"].shape[1], eos_ids(FAMILY.target, {}))
        stats.append(spec.last_stats)
    return g_test(samples, exact(case, warp)), stats
