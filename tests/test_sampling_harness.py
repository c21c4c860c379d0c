"""The sampling harness is checked both ways: HF's own sampler passes it, and samplers that favour the draft's first
child or draw the bonus token from p instead of p' fail it."""

from __future__ import annotations

import pytest
import torch
from sampling_cases import ALPHA, FAMILY, NEW_TOKENS, SAMPLES, WARPS, exact, speculative_test

import vlmspec.engine.choice
from vlmspec.engine.accept import Verdict, accept_sampled, deepest, draw
from vlmspec.engine.tree import DraftTree
from vlmspec.testing.distribution import continuations, eos_ids, g_test


@pytest.mark.parametrize("warp", list(WARPS))
def test_the_harness_passes_the_targets_own_sampler(warp):
    inputs = FAMILY.cases["image"]
    torch.manual_seed(0)
    sequences = FAMILY.target.generate(
        **inputs, do_sample=True, max_new_tokens=NEW_TOKENS, num_return_sequences=SAMPLES, **WARPS[warp]
    )
    samples = continuations(sequences, inputs["input_ids"].shape[1], eos_ids(FAMILY.target, {}))
    assert g_test(samples, exact("image", warp)).passes(ALPHA)


def _always_first_child(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """A wrong rule: accept the first child of every node (if the target gives it any mass), then sample."""
    first_child = torch.ones(tree.size, dtype=torch.bool, device=tree.tokens.device)
    seen: set[int] = set()
    for node in range(1, tree.size):
        parent = int(tree.parents[node])
        first_child[node] = parent not in seen and bool(probs[parent, tree.tokens[node]] > 0)
        seen.add(parent)
    path, accepted, last = deepest(tree, first_child)
    return Verdict(path, accepted, draw(probs[last], generator))


def _bonus_from_p(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator | None = None) -> Verdict:
    """A subtly wrong rule: recursive rejection, but the bonus token drawn from p, rejected children included."""
    verdict = accept_sampled(tree, probs, generator)
    last = verdict.path[verdict.accepted]
    return Verdict(verdict.path, verdict.accepted, draw(probs[last], generator))


@pytest.mark.parametrize(
    "rule, policy", [(_always_first_child, "sage"), (_bonus_from_p, "chain")], ids=["first_child", "bonus_from_p"]
)
def test_the_harness_rejects_a_biased_sampler(monkeypatch, rule, policy):
    monkeypatch.setattr(vlmspec.engine.choice, "accept_sampled", rule)
    result, _ = speculative_test(policy, "noisy", "image", "top_k_top_p")
    assert result.impossible == 0 and not result.passes(ALPHA)
