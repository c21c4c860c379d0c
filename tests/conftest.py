"""Shared fixtures: per family one tiny target, three kinds of draft, and real preprocessed inputs.

`pytest --device cuda` puts the families' models and inputs, the replica pairs the entry points load, and the
captioning jobs on that device (default: the CPU). `pytest --compile on` runs every decoding the tests do not
set otherwise through compiled forwards (default: off, whatever the device).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import pytest
import torch

from vlmspec.engine.compiled import COMPILE_CHOICES, COMPILE_ENV
from vlmspec.testing import (
    TINY_FAMILIES,
    chat_inputs,
    noisy_copy,
    sample_frames,
    sample_image,
    tiny_llava_onevision,
    tiny_qwen2_5_vl,
    tiny_qwen3_vl,
)

# Under pytest-xdist each worker gets one core's worth of threads, and so does every process its tests start.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

#: The device the tests run models on, set from `--device` before any model is built.
DEVICE = torch.device("cpu")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu", help="where the tests run models and inputs (cpu, cuda, cuda:1, ...)")
    parser.addoption(
        "--compile",
        default="off",
        choices=COMPILE_CHOICES,
        help="what compile='auto' does in the tests (sets VLMSPEC_COMPILE): on runs the suite's decoding compiled",
    )


def pytest_configure(config: pytest.Config) -> None:
    global DEVICE
    DEVICE = torch.device(config.getoption("--device"))
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda was given but torch sees no CUDA device")
    os.environ[COMPILE_ENV] = config.getoption("--compile")


def on_device(inputs: dict) -> dict:
    """Model inputs with every tensor moved to the test device."""
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def device_map() -> dict[str, str]:
    """`device_map` for loading a saved pair onto the test device."""
    return {"": str(DEVICE)}


def device_flags() -> list[str]:
    """The `--device` flag of the CLIs for the test device."""
    return ["--device", str(DEVICE)]


LONG_PROMPT = " ".join(
    ["Describe the image in detail: every shape, every colour, where each object is and how large it is."] * 6
)
CASES = ("text", "image", "two_images", "video", "long_prompt")
DRAFTS = ("self", "independent", "noisy")


@dataclass
class Family:
    """One model family's tiny target, its drafts and preprocessed inputs, built lazily and cached."""

    name: str
    make_processor: Callable
    make_target: Callable
    make_independent: Callable

    @cached_property
    def processor(self):
        return self.make_processor()

    @cached_property
    def target(self):
        return self.make_target().to(DEVICE)

    @cached_property
    def drafts(self):
        """The target itself, an independent random model, and a noisy copy of the target (partial acceptance)."""
        independent = self.make_independent().to(DEVICE)
        return {"self": self.target, "independent": independent, "noisy": noisy_copy(self.target, 0.05)}

    @cached_property
    def cases(self):
        return {name: on_device(inputs) for name, inputs in self.cpu_cases.items()}

    @cached_property
    def cpu_cases(self):
        """The cases as the processor returns them, on the CPU."""
        p = self.processor
        return {
            "text": chat_inputs(p, "Describe the image in detail."),
            "image": chat_inputs(p, "Describe the image in detail.", images=[sample_image(0)]),
            "two_images": chat_inputs(p, "What is shown here?", images=[sample_image(1), sample_image(2, (64, 64))]),
            "video": chat_inputs(p, "Describe the video in detail.", video=sample_frames(0, num_frames=5)),
            "long_prompt": chat_inputs(p, LONG_PROMPT, images=[sample_image(3)]),
        }

    @cached_property
    def _references(self):
        return {}

    def reference(self, case: str, max_new_tokens: int = 32, **kwargs) -> torch.Tensor:
        """The target's own greedy output, computed once per arguments."""
        key = (case, max_new_tokens, tuple(sorted(kwargs.items())))
        if key not in self._references:
            self._references[key] = self.target.generate(
                **self.cases[case], do_sample=False, max_new_tokens=max_new_tokens, **kwargs
            )
        return self._references[key]


#: Per family, the independent draft: a narrower random model (for the MoE target, a dense Qwen3-VL).
INDEPENDENT_DRAFTS = {
    "qwen2_5_vl": lambda: tiny_qwen2_5_vl(1, hidden_size=32, heads=2, kv_heads=1),
    "qwen3_vl": lambda: tiny_qwen3_vl(1, hidden_size=32, heads=2, kv_heads=1),
    "qwen3_vl_moe": lambda: tiny_qwen3_vl(2),
    "llava_onevision": lambda: tiny_llava_onevision(1, hidden_size=32, heads=2, kv_heads=1),
}
FAMILIES = {
    name: Family(name, make_processor, make_target, INDEPENDENT_DRAFTS[name])
    for name, (make_processor, make_target) in TINY_FAMILIES.items()
}


def save_pair(family: Family, root, draft: str = "noisy") -> tuple[str, str]:
    """Write the target with its processor and a draft with the tokenizer, as `save_pretrained` directories."""
    family.target.save_pretrained(root / "target")
    family.processor.save_pretrained(root / "target")
    family.drafts[draft].save_pretrained(root / "draft")
    family.processor.tokenizer.save_pretrained(root / "draft")
    return str(root / "target"), str(root / "draft")


@pytest.fixture(scope="session", params=list(FAMILIES))
def family(request) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="session")
def qwen() -> Family:
    """The Qwen2.5-VL family, for tests of behaviour that does not depend on the family."""
    return FAMILIES["qwen2_5_vl"]


@pytest.fixture(scope="session")
def target(qwen):
    return qwen.target


@pytest.fixture(scope="session")
def drafts(qwen):
    return qwen.drafts


@pytest.fixture(scope="session")
def cases(qwen):
    return qwen.cases


@pytest.fixture(scope="session")
def reference(qwen):
    return qwen.reference


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device of `--device`."""
    return DEVICE


@pytest.fixture(scope="session")
def replica_pairs(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Per family, the directories of the README's released target and draft, replicated: released files, tiny
    random weights (written once per session)."""
    from vlmspec.testing import write_replicas

    return write_replicas(tmp_path_factory.mktemp("replicas"))
