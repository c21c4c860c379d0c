"""The generate()-compatible surface: arguments, streamers, return types, stats and clear errors."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import GenerationConfig, TextIteratorStreamer, TextStreamer

from vlmspec import (
    ChainPolicy,
    SageConfig,
    SpeculativeVLM,
    UnsupportedModelError,
    VocabularyMismatchError,
)
from vlmspec.engine.stats import PHASES
from vlmspec.testing import build_tokenizer, tiny_qwen2_5_vl


def test_policy_can_be_a_name_a_config_or_an_object(target):
    assert SpeculativeVLM(target, target, policy="chain").policy.name == "chain"
    assert SpeculativeVLM(target, target, policy=SageConfig(depth_max=6)).policy.config.depth_max == 6
    assert SpeculativeVLM(target, target, policy=ChainPolicy(3)).policy.length == 3
    with pytest.raises(ValueError, match="unknown policy"):
        SpeculativeVLM(target, target, policy="beam")


def test_return_dict_in_generate_gives_sequences(target, cases, reference):
    out = SpeculativeVLM(target, target).generate(**cases["image"], max_new_tokens=32, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference("image"))


def test_generation_config_is_honoured(target, cases, reference):
    config = GenerationConfig(max_new_tokens=32, do_sample=False)
    out = SpeculativeVLM(target, target).generate(**cases["image"], generation_config=config)
    assert torch.equal(out, reference("image"))


def test_text_streamer_prints_the_generated_text(target, cases, reference, capsys):
    tokenizer = build_tokenizer()
    SpeculativeVLM(target, target).generate(
        **cases["image"], max_new_tokens=32, streamer=TextStreamer(tokenizer, skip_prompt=True)
    )
    prompt_length = cases["image"]["input_ids"].shape[1]
    expected = tokenizer.decode(reference("image")[0, prompt_length:])
    assert capsys.readouterr().out.strip() == expected.strip()


def test_iterator_streamer_yields_tokens_as_they_are_accepted(target, cases, reference):
    tokenizer = build_tokenizer()
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    spec = SpeculativeVLM(target, target, policy="chain")
    thread = threading.Thread(target=spec.generate, kwargs=dict(**cases["text"], max_new_tokens=32, streamer=streamer))
    thread.start()
    text = "".join(streamer)
    thread.join()
    prompt_length = cases["text"]["input_ids"].shape[1]
    assert text == tokenizer.decode(reference("text")[0, prompt_length:])


def test_stats_describe_the_call(target, drafts, cases):
    spec = SpeculativeVLM(target, drafts["noisy"], policy="sage", pruning=None)
    out = spec.generate(**cases["video"], max_new_tokens=32)
    stats = spec.last_stats
    prompt_length = cases["video"]["input_ids"].shape[1]
    assert stats.new_tokens == out.shape[1] - prompt_length == 32
    assert stats.iterations == len(stats.steps) > 0
    drafted = [s.accepted for s in stats.steps if s.plain is None]
    assert stats.mean_accept_length == pytest.approx(sum(drafted) / len(drafted))
    assert stats.plain_steps == stats.iterations - len(drafted)
    assert stats.target_prefill_tokens == stats.draft_prefill_tokens == prompt_length
    assert set(stats.phase_seconds) == set(PHASES)
    assert all(v >= 0 for v in stats.phase_seconds.values())
    assert sum(s.accepted + 1 for s in stats.steps) + 1 >= stats.new_tokens


def test_a_batch_without_a_mask_decodes_every_row_as_generate(target, drafts, cases):
    ids = cases["text"]["input_ids"].repeat(2, 1)
    out = SpeculativeVLM(target, drafts["noisy"]).generate(input_ids=ids, do_sample=False, max_new_tokens=6)
    assert torch.equal(out, target.generate(input_ids=ids, do_sample=False, max_new_tokens=6))


def test_unknown_generate_arguments_are_refused(target, cases):
    with pytest.raises(TypeError, match="not_an_argument"):
        SpeculativeVLM(target, target).generate(**cases["text"], not_an_argument=1)


def test_mismatched_special_tokens_are_refused(target):
    other = tiny_qwen2_5_vl(seed=2)
    other.config.image_token_id = other.config.video_token_id
    with pytest.raises(VocabularyMismatchError, match="image_token_id"):
        SpeculativeVLM(target, other)


def test_unsupported_model_class_is_named(target):
    plain = torch.nn.Linear(2, 2)
    with pytest.raises(UnsupportedModelError, match="Linear"):
        SpeculativeVLM(plain, target)
