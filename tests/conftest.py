"""Shared fixtures: one tiny Qwen2.5-VL target, three kinds of draft, and real preprocessed inputs."""

from __future__ import annotations

import pytest
import torch

from vlmspec.testing import noisy_copy, qwen_inputs, sample_frames, sample_image, tiny_processor, tiny_qwen2_5_vl

torch.set_num_threads(2)

LONG_PROMPT = " ".join(
    ["Describe the image in detail: every shape, every colour, where each object is and how large it is."] * 6
)


@pytest.fixture(scope="session")
def processor():
    return tiny_processor()


@pytest.fixture(scope="session")
def target():
    return tiny_qwen2_5_vl(seed=0)


@pytest.fixture(scope="session")
def drafts(target):
    """The target itself, an independent random model, and a noisy copy of the target (partial acceptance)."""
    return {
        "self": target,
        "independent": tiny_qwen2_5_vl(seed=1, hidden_size=32, heads=2, kv_heads=1),
        "noisy": noisy_copy(target, scale=0.05, seed=0),
    }


@pytest.fixture(scope="session")
def cases(processor):
    return {
        "text": qwen_inputs(processor, "Describe the image in detail."),
        "image": qwen_inputs(processor, "Describe the image in detail.", images=[sample_image(0)]),
        "two_images": qwen_inputs(processor, "What is shown here?", images=[sample_image(1), sample_image(2, (64, 64))]),
        "video": qwen_inputs(processor, "Describe the video in detail.", video=sample_frames(0, num_frames=5)),
        "long_prompt": qwen_inputs(processor, LONG_PROMPT, images=[sample_image(3)]),
    }


@pytest.fixture(scope="session")
def reference(target, cases):
    """The target's own greedy output for each case, computed once."""
    cache = {}

    def get(case: str, max_new_tokens: int = 32, **kwargs) -> torch.Tensor:
        key = (case, max_new_tokens, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = target.generate(**cases[case], do_sample=False, max_new_tokens=max_new_tokens, **kwargs)
        return cache[key]

    return get
