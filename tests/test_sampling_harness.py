"""The sampling harness is checked both ways: HF's own sampler passes it, and samplers that favour the draft's first
child or draw the bonus token from p instead of p' fail it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from one_tree import deepest
from sampling_cases import ALPHA, FAMILY, NEW_TOKENS, SAMPLES, WARPS, exact, speculative_test

import vlmspec.engine.accept
import vlmspec.engine.acceptance
from vlmspec.engine.accept import SamplingNoise, Verdict, draw_with, sampled_verdict
from vlmspec.engine.tree import Tree, Trees
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


#: The engine's own rule, kept before a test replaces it.
RIGHT_RULE = sampled_verdict


def _always_first_child(tree: Tree, probs: torch.Tensor, noise: SamplingNoise) -> Verdict:
    """A wrong rule: accept the first child of every node (if the target gives it any mass), then sample."""
    first_child = torch.ones(tree.size, dtype=torch.bool, device=tree.tokens.device)
    seen: set[int] = set()
    for node in range(1, tree.size):
        parent = int(tree.parents[node])
        first_child[node] = parent not in seen and bool(probs[parent, tree.tokens[node]] > 0)
        seen.add(parent)
    path, accepted, last = deepest(tree, first_child)
    return Verdict(path, accepted, draw_with(probs[last], noise.exponentials[0]))


def _bonus_from_p(tree: Tree, probs: torch.Tensor, noise: SamplingNoise) -> Verdict:
    """A subtly wrong rule: recursive rejection, but the bonus token drawn from p, rejected children included."""
    verdict = RIGHT_RULE(tree.rows(), probs[None], noise).row(0)
    last = verdict.path[verdict.accepted]
    return Verdict(verdict.path, verdict.accepted, draw_with(probs[last], noise.exponentials[0]))


def _row_by_row(rule: Callable[[Tree, torch.Tensor, SamplingNoise], Verdict]) -> Callable[..., Verdict]:
    """`rule` as the batch's rule (`sampled_verdict`): applied to each row's valid tree alone, with its noise."""

    def rows_rule(trees: Trees, probs: torch.Tensor, noise: SamplingNoise) -> Verdict:
        verdicts = []
        for b in range(probs.shape[0]):
            n = trees.size if trees.valid is None else int(trees.valid[b].sum())
            tree = trees.row(b, n, int(trees.depths[:n].max()))
            own = SamplingNoise(noise.uniforms[b : b + 1, :n], noise.exponentials[b : b + 1])
            verdict = rule(tree, probs[b, :n], own)
            path = torch.zeros(trees.depth + 1, dtype=torch.long, device=probs.device)
            path[: verdict.path.shape[0]] = verdict.path
            verdicts.append(Verdict(path, verdict.accepted, verdict.bonus))
        return Verdict(*(torch.stack([getattr(v, name) for v in verdicts]) for name in ("path", "accepted", "bonus")))

    return rows_rule


@pytest.mark.parametrize(
    "rule, policy", [(_always_first_child, "sage"), (_bonus_from_p, "chain")], ids=["first_child", "bonus_from_p"]
)
def test_the_harness_rejects_a_biased_sampler(monkeypatch, rule, policy):
    for module in (vlmspec.engine.acceptance, vlmspec.engine.accept):
        monkeypatch.setattr(module, "sampled_verdict", _row_by_row(rule))
    result, _ = speculative_test(policy, "noisy", "image", "top_k_top_p")
    assert result.impossible == 0 and not result.passes(ALPHA)
