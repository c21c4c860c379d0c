"""Verifier-guided pruning: attention scores, token selection, and the pruned draft prefill."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from vlmspec import PruningConfig, SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.engine.model_runner import ModelRunner
from vlmspec.pruning import VerifierScores, group_budgets, select_random, select_two_stage, select_uniform


def eager_reference(model, inputs, layout) -> torch.Tensor:
    """Mean attention of the trailing text rows on each visual token, from full eager attention matrices."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    adapter = adapter_for(eager)
    model_inputs = {k: inputs[k] for k in adapter.input_keys if k not in adapter.position_only_keys and k in inputs}
    out = eager(**model_inputs, position_ids=adapter.prompt_positions(inputs), output_attentions=True)
    visual = layout.positions
    rows = torch.arange(int(visual[-1]) + 1, inputs["input_ids"].shape[1])
    per_layer = [a[0][:, rows][:, :, visual].mean(dim=(0, 1)) for a in out.attentions]
    return torch.stack(per_layer).mean(dim=0)


@pytest.mark.parametrize("case", ["image", "video"])
def test_verifier_scores_match_eager_attention(family, case):
    inputs = family.cases[case]
    adapter = adapter_for(family.target)
    layout = adapter.visual_layout(inputs)
    with torch.no_grad(), VerifierScores(adapter, layout) as scorer:
        adapter.prefill(inputs, adapter.new_cache())
    assert scorer.layers_seen == len(adapter.attention_modules())
    torch.testing.assert_close(scorer.scores, eager_reference(family.target, inputs, layout), rtol=1e-4, atol=1e-6)


def test_verifier_scores_average_only_the_chosen_layers(qwen):
    inputs = qwen.cases["image"]
    adapter = adapter_for(qwen.target)
    layout = adapter.visual_layout(inputs)
    with torch.no_grad(), VerifierScores(adapter, layout, layers=[1]) as scorer:
        adapter.prefill(inputs, adapter.new_cache())
    assert scorer.layers_seen == 1


def test_layout_gives_one_group_per_image(family):
    layout = adapter_for(family.target).visual_layout(family.cases["two_images"])
    assert layout.groups.unique().tolist() == [0, 1]
    assert layout.groups.shape[0] == int(layout.mask.sum())


def test_layout_gives_one_group_per_video_frame(qwen):
    inputs = qwen.cases["video"]
    layout = adapter_for(qwen.target).visual_layout(inputs)
    frames = int(inputs["video_grid_thw"][0, 0])
    assert layout.groups.unique().numel() == frames
    assert torch.bincount(layout.groups).unique().numel() == 1


GROUPS = torch.tensor([0] * 10 + [1] * 7 + [2] * 16)


@pytest.mark.parametrize("ratio", [0.0, 0.5, 0.8, 0.9])
def test_every_method_keeps_the_per_group_budget_in_order(ratio):
    scores = torch.rand(GROUPS.shape[0], generator=torch.Generator().manual_seed(0))
    _, budgets = group_budgets(GROUPS, ratio)
    assert budgets.tolist() == [math.ceil((1 - ratio) * n) for n in (10, 7, 16)]
    for kept in (
        select_uniform(GROUPS, ratio),
        select_random(GROUPS, ratio, seed=3),
        select_two_stage(GROUPS, ratio, scores),
    ):
        assert kept.tolist() == sorted(set(kept.tolist()))
        assert torch.bincount(GROUPS[kept], minlength=3).tolist() == budgets.tolist()


def test_uniform_selection_is_evenly_spread():
    kept = select_uniform(torch.zeros(100, dtype=torch.long), 0.9)
    assert kept.tolist() == [5, 15, 25, 35, 45, 55, 65, 75, 85, 95]


def test_random_selection_is_deterministic_for_a_seed():
    assert torch.equal(select_random(GROUPS, 0.6, seed=7), select_random(GROUPS, 0.6, seed=7))
    assert not torch.equal(select_random(GROUPS, 0.6, seed=7), select_random(GROUPS, 0.6, seed=8))


def test_two_stage_keeps_the_highest_scoring_tokens_first():
    groups = torch.zeros(20, dtype=torch.long)
    scores = torch.zeros(20)
    scores[[3, 17]] = 1.0
    kept = select_two_stage(groups, 0.8, scores, verifier_share=0.5)
    assert kept.shape[0] == 4
    assert {3, 17} <= set(kept.tolist())
    assert select_two_stage(groups, 0.8, scores, verifier_share=0.0).tolist() == select_uniform(groups, 0.8).tolist()


def test_invalid_ratio_is_refused():
    with pytest.raises(ValueError, match="prune_ratio"):
        PruningConfig(ratio=1.0)
    with pytest.raises(ValueError, match="unknown pruning method"):
        PruningConfig(method="attention")


@pytest.mark.parametrize(("case", "default_ratio"), [("image", 0.8), ("two_images", 0.8), ("video", 0.9)])
def test_draft_prefill_counts_text_plus_the_kept_share_of_each_group(family, case, default_ratio):
    inputs = family.cases[case]
    layout = adapter_for(family.target).visual_layout(inputs)
    counts = torch.bincount(layout.groups).tolist()
    text = inputs["input_ids"].shape[1] - int(layout.mask.sum())
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], pruning="uniform")
    spec.generate(**inputs, max_new_tokens=4)
    assert spec.last_stats.draft_prefill_tokens == text + sum(math.ceil((1 - default_ratio) * n) for n in counts)
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], pruning="verifier", prune_ratio=0.5)
    spec.generate(**inputs, max_new_tokens=4)
    assert spec.last_stats.draft_prefill_tokens == text + sum(math.ceil(0.5 * n) for n in counts)
    assert spec.last_stats.target_prefill_tokens == inputs["input_ids"].shape[1]
    assert spec.last_stats.phase_seconds["pruning"] > 0


def test_a_batched_pruned_prefill_fills_each_row_as_its_own_pruned_prefill(family):
    """Prompts prefilled together, each cut to its own kept tokens (or not cut), hold in their cache rows what each
    prompt's own pruned prefill holds, and continue from the same positions."""
    adapter = adapter_for(family.target)
    cases = ("image", "video", "text")
    rows = [family.cases[c] for c in cases]
    pruning = PruningConfig(method="uniform", ratio=0.5)
    keeps = []
    for inputs in rows:
        layout = adapter.visual_layout(inputs)
        keeps.append(pruning.keep_mask(layout, adapter.has_video(inputs), None) if bool(layout.mask.any()) else None)
    batch = adapter.join_rows(rows, 0)
    width = batch["input_ids"].shape[1]
    keep = torch.zeros(batch["input_ids"].shape, dtype=torch.bool, device=batch["input_ids"].device)
    for b, (inputs, own) in enumerate(zip(rows, keeps, strict=True)):
        keep[b, width - inputs["input_ids"].shape[1] :] = True if own is None else own
    together = ModelRunner(adapter)
    together.start(len(rows))
    with torch.no_grad():
        counts = keep.sum(1).tolist()
        logits, prompts = together.prefill_rows(batch, counts, 0, keep)
        for prompt in prompts:
            together.take(prompt, 0)
        for b, (inputs, own) in enumerate(zip(rows, keeps, strict=True)):
            alone = ModelRunner(adapter)
            last, prompt = alone.prefill(inputs, 0, own)
            alone.take(prompt, 0)
            assert prompt.length == counts[b] == together.lengths[b]
            assert prompts[b].offset == prompt.offset
            torch.testing.assert_close(logits[b], last, rtol=1e-4, atol=1e-5)
            for layer in range(len(alone.cache.layers)):
                pairs = zip(together.cache.layer_slab(layer), alone.cache.layer_slab(layer), strict=True)
                for ours, theirs in pairs:
                    torch.testing.assert_close(ours[b, :, : counts[b]], theirs[0, :, : counts[b]], rtol=1e-4, atol=1e-5)


def test_text_only_prompts_are_not_pruned(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], pruning="verifier")
    spec.generate(**qwen.cases["text"], max_new_tokens=4)
    assert spec.last_stats.draft_prefill_tokens == spec.last_stats.target_prefill_tokens


def test_a_vlm_drafts_default_is_verifier_guided_pruning(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"])
    assert spec.pruning is not None and spec.pruning.method == "verifier"
