"""Stopping exactly as `generate` does: EOS inside an accepted path, max_new_tokens, min_new_tokens."""

from __future__ import annotations

import pytest
import torch

from vlmspec import SpeculativeVLM


def test_eos_inside_an_accepted_path_stops_there(target, cases, reference):
    prompt_length = cases["image"]["input_ids"].shape[1]
    new = reference("image", 32)[0, prompt_length:]
    eos = int(new[7])
    expected = target.generate(**cases["image"], do_sample=False, max_new_tokens=32, eos_token_id=eos)
    spec = SpeculativeVLM(target, target, policy="chain")
    out = spec.generate(**cases["image"], max_new_tokens=32, eos_token_id=eos)
    assert torch.equal(out, expected)
    assert int(out[0, -1]) == eos
    assert eos not in out[0, prompt_length:-1].tolist()


@pytest.mark.parametrize("policy", ["chain", "static-tree", "sage"])
def test_max_new_tokens_gives_exactly_that_many_tokens(target, drafts, cases, reference, policy):
    prompt_length = cases["text"]["input_ids"].shape[1]
    full = reference("text", 40)
    spec = SpeculativeVLM(target, drafts["noisy"], policy=policy)
    for n in range(1, 41):
        out = spec.generate(**cases["text"], max_new_tokens=n)
        assert out.shape[1] - prompt_length == n
        assert torch.equal(out, full[:, : prompt_length + n])


def test_min_new_tokens_holds_eos_back(target, cases, reference):
    prompt_length = cases["video"]["input_ids"].shape[1]
    eos = int(reference("video", 32)[0, prompt_length + 2])
    kwargs = dict(max_new_tokens=24, eos_token_id=eos, min_new_tokens=12)
    expected = target.generate(**cases["video"], do_sample=False, **kwargs)
    out = SpeculativeVLM(target, target, policy="sage").generate(**cases["video"], **kwargs)
    assert torch.equal(out, expected)
    assert eos not in out[0, prompt_length : prompt_length + 12].tolist()


def test_repetition_penalty_from_generation_config_is_applied(target, drafts, cases):
    expected = target.generate(**cases["text"], do_sample=False, max_new_tokens=24, repetition_penalty=1.3)
    out = SpeculativeVLM(target, drafts["noisy"], policy="static-tree").generate(
        **cases["text"], max_new_tokens=24, repetition_penalty=1.3
    )
    assert torch.equal(out, expected)
