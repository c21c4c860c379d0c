"""The target's own generation config decides the output: one-token sampling is greedy, processors reach the draft."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DRAFTS
from transformers import GenerationConfig

from vlmspec import SpeculativeVLM

#: Qwen2.5-VL-Instruct's released sampling settings: top_k=1 leaves one token, so generate is deterministic.
QWEN2_5_VL_RELEASED = dict(do_sample=True, top_k=1, top_p=0.001, temperature=0.1, repetition_penalty=1.05)


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    """An independent copy of `model` (weights and configs), to change without touching the fixture."""
    return copy.deepcopy(model)


@pytest.mark.parametrize("policy", ["chain", "static-tree", "sage"])
@pytest.mark.parametrize("draft_name", DRAFTS)
def test_one_token_sampling_config_equals_target_generate(qwen, draft_name, policy):
    config = GenerationConfig(**QWEN2_5_VL_RELEASED, eos_token_id=qwen.target.generation_config.eos_token_id)
    inputs = qwen.cases["image"]
    reference = qwen.target.generate(**inputs, generation_config=config, max_new_tokens=24)
    spec = SpeculativeVLM(qwen.target, qwen.drafts[draft_name], policy=policy)
    assert torch.equal(spec.generate(**inputs, generation_config=config, max_new_tokens=24), reference)


def test_the_models_default_config_is_the_default(qwen):
    target = _copy(qwen.target)
    eos = target.generation_config.eos_token_id
    target.generation_config = GenerationConfig(**QWEN2_5_VL_RELEASED, eos_token_id=eos)
    inputs = qwen.cases["text"]
    reference = target.generate(**inputs, max_new_tokens=24)
    assert torch.equal(SpeculativeVLM(target, qwen.drafts["noisy"]).generate(**inputs, max_new_tokens=24), reference)


def test_ties_are_broken_as_the_warpers_break_them(qwen):
    """With two identical head rows, top-k 1 keeps both and top-p keeps the one sorted last; argmax would not."""
    target = _copy(qwen.target)
    inputs = qwen.cases["text"]
    greedy = target.generate(**inputs, do_sample=False, max_new_tokens=16)[0, inputs["input_ids"].shape[1] :]
    favourite = int(greedy.mode().values)
    twin = target.config.get_text_config().vocab_size - 1
    with torch.no_grad():
        target.get_output_embeddings().weight[twin] = target.get_output_embeddings().weight[favourite]
    config = GenerationConfig(do_sample=True, top_k=1, top_p=0.001, temperature=0.1)
    reference = target.generate(**inputs, generation_config=config, max_new_tokens=16)
    assert twin in reference[0].tolist() and favourite not in reference[0, inputs["input_ids"].shape[1] :].tolist()
    spec = SpeculativeVLM(target, qwen.drafts["noisy"], policy="static-tree")
    assert torch.equal(spec.generate(**inputs, generation_config=config, max_new_tokens=16), reference)


@pytest.mark.parametrize(
    "settings",
    [dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=2), dict(repetition_penalty=1.1, min_new_tokens=12)],
    ids=["repetition_penalty", "no_repeat_ngram", "penalty_and_min_new_tokens"],
)
def test_a_self_draft_under_the_same_processors_is_always_accepted(qwen, settings):
    inputs = qwen.cases["image"]
    reference = qwen.target.generate(**inputs, do_sample=False, max_new_tokens=24, **settings)
    spec = SpeculativeVLM(qwen.target, qwen.target, policy="sage", pruning=None)
    assert torch.equal(spec.generate(**inputs, do_sample=False, max_new_tokens=24, **settings), reference)
    assert all(step.accepted == step.greedy_depth for step in spec.last_stats.steps)


def test_the_penalty_does_not_collapse_acceptance(qwen):
    inputs = qwen.cases["text"]
    spec = SpeculativeVLM(qwen.target, qwen.target, policy="chain", pruning=None)
    spec.generate(**inputs, do_sample=False, max_new_tokens=30)
    plain = spec.last_stats.mean_accept_length
    spec.generate(**inputs, do_sample=False, max_new_tokens=30, repetition_penalty=1.05)
    assert spec.last_stats.mean_accept_length == pytest.approx(plain, abs=0.5)


def test_sage_reads_its_confidence_from_the_drafts_warped_distribution(qwen):
    """A low temperature sharpens the draft's distribution (confident SAGE), a high one flattens it."""
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="sage")

    def mean_alpha(temperature: float) -> float:
        spec.generate(
            **qwen.cases["image"],
            do_sample=True,
            temperature=temperature,
            top_k=0,
            max_new_tokens=24,
            generator=torch.Generator().manual_seed(0),
        )
        alphas = [step.alpha for step in spec.last_stats.steps[1:] if step.plain is None]
        return sum(alphas) / len(alphas)

    assert mean_alpha(0.3) > mean_alpha(1.0) > mean_alpha(3.0)


def _padded(model: torch.nn.Module, extra: int, boost: float) -> torch.nn.Module:
    """A copy whose head and embeddings have `extra` padding rows, their logits pushed up by `boost`."""
    padded = _copy(model)
    rows = padded.get_output_embeddings().weight.shape[0]
    padded.resize_token_embeddings(rows + extra, mean_resizing=False)
    with torch.no_grad():
        head = padded.get_output_embeddings().weight
        head[rows:] = head[:rows].mean(0) + boost * head[:rows].std()
    return padded


def test_padded_heads_pair_up_and_padding_is_never_proposed(qwen):
    draft = _padded(qwen.target, extra=16, boost=50.0)
    inputs = qwen.cases["image"]
    spec = SpeculativeVLM(qwen.target, draft, policy="sage", pruning=None)
    assert torch.equal(spec.generate(**inputs, max_new_tokens=24), qwen.reference("image", 24))
    assert all(step.accepted == step.greedy_depth for step in spec.last_stats.steps)


def test_a_target_emitting_ids_the_draft_cannot_embed_stays_exact(qwen):
    target = _padded(qwen.target, extra=16, boost=3.0)
    inputs = qwen.cases["text"]
    reference = target.generate(**inputs, do_sample=False, max_new_tokens=24)
    assert int(reference.max()) >= qwen.target.get_output_embeddings().weight.shape[0]
    spec = SpeculativeVLM(target, qwen.target, policy="static-tree", pruning=None)
    assert torch.equal(spec.generate(**inputs, max_new_tokens=24), reference)
