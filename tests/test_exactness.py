"""Speculative output equals the target's own greedy `generate`, token for token, for every family, policy and draft."""

from __future__ import annotations

import pytest
import torch
from conftest import CASES, DEVICE, DRAFTS, on_device

from vlmspec import SageConfig, SageGtConfig, SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.engine.model_runner import ModelRunner
from vlmspec.testing import chat_inputs, sample_frames
from vlmspec.testing.distribution import extend_inputs

POLICIES = ("chain", "static-tree", "sage", "sage-gt")


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("draft_name", DRAFTS)
@pytest.mark.parametrize("case", CASES)
def test_greedy_output_equals_target_generate(family, case, draft_name, policy):
    spec = SpeculativeVLM(family.target, family.drafts[draft_name], policy=policy, pruning=None)
    if policy == "sage-gt":
        assert torch.equal(spec.generate(**family.cases[case], max_new_tokens=32), family.reference(case))
    out = spec.generate(**family.cases[case], max_new_tokens=32)
    assert torch.equal(out, family.reference(case))
    stats = spec.last_stats
    assert stats.new_tokens == out.shape[1] - family.cases[case]["input_ids"].shape[1]
    if draft_name == "self":
        assert all(step.accepted == step.greedy_depth for step in stats.steps)
        assert all(step.greedy_depth == step.tree_depth for step in stats.steps if not policy.startswith("sage"))


def test_sage_gt_stays_exact_once_it_sizes_trees_by_cost(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="sage-gt", pruning=None)
    for case in ("image", "video", "image"):
        assert torch.equal(spec.generate(**qwen.cases[case], max_new_tokens=32), qwen.reference(case))
    drafted = [step for step in spec.last_stats.steps[1:] if step.plain is None]
    assert spec.policy.ready
    assert all(step.predicted_tokens is not None for step in drafted)
    assert len({step.nodes for step in drafted}) > 1


@pytest.mark.parametrize("pruning", ["verifier", "uniform", "random"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", ["image", "two_images", "video"])
def test_pruning_the_draft_never_changes_the_output(family, case, policy, pruning):
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy, pruning=pruning)
    out = spec.generate(**family.cases[case], max_new_tokens=32)
    assert torch.equal(out, family.reference(case))
    assert spec.last_stats.draft_prefill_tokens < spec.last_stats.target_prefill_tokens


def test_self_draft_accepts_every_planned_token_of_a_chain(target, cases):
    spec = SpeculativeVLM(target, target, policy="chain", pruning=None)
    spec.generate(**cases["image"], max_new_tokens=31)
    assert [s.accepted for s in spec.last_stats.steps] == [5] * 5
    assert spec.last_stats.mean_accept_length == 5.0


def test_noisy_draft_is_accepted_only_partially(target, drafts, cases):
    spec = SpeculativeVLM(target, drafts["noisy"], policy="static-tree")
    spec.generate(**cases["image"], max_new_tokens=32)
    accepted = [s.accepted for s in spec.last_stats.steps]
    assert 0 < sum(accepted) < 5 * len(accepted)


def test_text_after_a_long_clip_goes_on_from_the_last_prompt_position(family):
    """A clip of many small frames and a short question: the video's temporal positions end above the question's,
    and the token after the prompt must still see the logits a full forward over prompt + token gives."""
    inputs = on_device(chat_inputs(family.processor, "Why?", video=sample_frames(4, num_frames=32, size=(28, 28))))
    adapter = adapter_for(family.target)
    positions = adapter.prompt_positions(inputs)
    if family.name.startswith("qwen2_5"):
        assert int(positions[..., -1].max()) < int(positions.max())
    token = torch.tensor([7], device=DEVICE)
    extended = extend_inputs(inputs, (7,))
    with torch.inference_mode():
        full = family.target(**extended).logits[0, -1]
        runner = ModelRunner(adapter)
        _, prompt = runner.prefill(inputs, room=1)
        runner.take(prompt, room=1)
        start = torch.tensor(runner.positions(runner.lengths), device=DEVICE)
        depth = torch.zeros(1, dtype=torch.long, device=DEVICE)
        decoded = runner.forward_rows(token[None], depth, start, None)[0, 0]
    torch.testing.assert_close(decoded, full, rtol=1e-4, atol=1e-4)


def test_processor_outputs_on_the_cpu_decode_on_the_models_device(qwen):
    """Inputs as the processor returns them (on the CPU), a `min_new_tokens` processor, models on the test device."""
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    settings = dict(do_sample=False, max_new_tokens=16, min_new_tokens=12)
    expected = qwen.target.generate(**qwen.cases["image"], **settings)
    assert torch.equal(spec.generate(**qwen.cpu_cases["image"], **settings).cpu(), expected.cpu())


@pytest.mark.parametrize("case", ["image", "video", "long_prompt"])
def test_sage_gt_with_fixed_shapes_equals_target_generate(family, case):
    """sage-gt's masked levels (as many as the last tree's levels paid for) leave the output unchanged."""
    policy = SageGtConfig(sage=SageConfig(fixed_shapes=True))
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy)
    for _ in range(2):
        assert torch.equal(spec.generate(**family.cases[case], max_new_tokens=32), family.reference(case))
    assert spec.policy.ready


@pytest.mark.parametrize("case", ["image", "video", "long_prompt"])
def test_sage_grows_the_same_trees_with_fixed_shapes(family, case):
    """Levels of fixed slots with the rejected children masked (what accelerators run) give the trees, acceptance
    and output of levels cut on the host."""
    runs = []
    for fixed_shapes in (True, False):
        policy = SageConfig(fixed_shapes=fixed_shapes)
        spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy)
        out = spec.generate(**family.cases[case], max_new_tokens=32)
        assert torch.equal(out, family.reference(case))
        runs.append([(s.nodes, s.accepted, s.tree_depth, s.greedy_depth) for s in spec.last_stats.steps])
    assert runs[0] == runs[1]
    assert len({nodes for nodes, *_ in runs[0]}) > 1
