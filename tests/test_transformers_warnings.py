"""vlmspec's own forwards use the arguments transformers asks for today: decoding raises no `FutureWarning` (5.24
warns on every forward given the deprecated `past_key_values`, removed in 5.40), greedy, sampling and batched, with
and without pruning, in every family; and the project declares the transformers it is tested on."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import transformers
from conftest import FAMILIES
from test_batch import padded_batch

from vlmspec import SpeculativeVLM


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize(
    ("policy", "pruning", "settings"),
    [("sage", "verifier", {"do_sample": False}), ("chain", None, {"do_sample": True, "top_k": 4})],
)
def test_decoding_raises_no_future_warning(name, policy, pruning, settings):
    family = FAMILIES[name]
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy, pruning=pruning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        spec.generate(**family.cases["image"], max_new_tokens=6, **settings)


def test_a_padded_batch_raises_no_future_warning():
    family = FAMILIES["qwen2_5_vl"]
    inputs = padded_batch(family)
    spec = SpeculativeVLM(family.target, family.drafts["noisy"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        spec.generate(**inputs, max_new_tokens=6, do_sample=False)


def test_the_declared_transformers_floor_is_the_version_the_suite_runs_on_or_below():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    (floor_text,) = re.findall(r'"transformers>=([\d.]+)', pyproject)
    floor = tuple(int(v) for v in floor_text.split("."))
    assert floor >= (5, 24), "forwards pass `cache=`, which transformers accepts from 5.24"
    assert tuple(int(v) for v in transformers.__version__.split(".")[:2]) >= floor[:2]
