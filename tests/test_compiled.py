"""Compiled forwards: fixed shapes (padded tokens, a fixed cache, a mask over its capacity; for batches, rows padded
to their bucket) decode exactly, eager and under `torch.compile`; `compile=` resolves as documented."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from test_batch import NEW_TOKENS, ROWS, assert_rows_equal_their_own_generate, padded_batch

from vlmspec import SpeculativeVLM
from vlmspec.engine.compiled import (
    CACHE_ENV,
    COMPILE_ENV,
    cache_folder,
    compiled_forward,
    fixed_capacity,
    padded_size,
    resolve_compile,
    row_bucket,
)
from vlmspec.testing import tiny_qwen2_5_vl

POLICIES = ("chain", "static-tree", "sage", "sage-gt")


def two_rows_eos(family, first: int = 2, within: int = 12) -> int:
    """A token exactly two of the batch's rows first emit between `first` and `within` new tokens in, and the others
    never: as EOS it stops those two early but not at once, whatever trees the policy grows (a timed policy's trees
    change with the machine's load), so the bucket of 4 rows shrinks to 2 while the others decode on."""
    prompts = [family.cases[case]["input_ids"].shape[1] for case in ROWS]
    news = [family.reference(case, NEW_TOKENS)[0, length:].tolist() for case, length in zip(ROWS, prompts, strict=True)]
    for token in sorted({token for new in news for token in new[first:within]}):
        early = [i for i, new in enumerate(news) if token in new[first:within] and token not in new[:first]]
        if len(early) == 2 and all(token not in new for i, new in enumerate(news) if i not in early):
            return token
    raise AssertionError("no token stops exactly two rows early")


class DecodingForwards:
    """What each decoding forward of `model` is given (those with a 4-D mask; the prompt's forwards have none): the
    rows, the tokens, the keys the mask spans, and the cache it writes into."""

    def __init__(self, model: torch.nn.Module):
        self.seen: list[tuple[int, int, int, object]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs) -> None:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            rows, tokens = kwargs["input_ids"].shape
            self.seen.append((rows, tokens, mask.shape[-1], kwargs["cache"]))


def test_padded_sizes_are_powers_of_two_then_multiples_of_sixteen():
    assert [padded_size(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 26, 64, 65)] == [1, 2, 4, 8, 8, 16, 16, 32, 32, 64, 80]


def test_row_buckets_are_powers_of_two():
    assert [row_bucket(n) for n in (1, 2, 3, 4, 5, 9, 16, 17, 32)] == [1, 2, 4, 4, 8, 16, 16, 32, 32]


def test_fixed_capacities_are_few_and_waste_at_most_an_eighth():
    assert fixed_capacity(1) == 256 and fixed_capacity(300) == 512 and fixed_capacity(2329) == 2560
    sizes = {fixed_capacity(n) for n in range(1, 20000)}
    assert len(sizes) <= 8 * 6
    assert all(fixed_capacity(n) - n <= max(255, n // 8 + 1) for n in range(1, 20000, 7))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("case", ["image", "video", "long_prompt"])
def test_fixed_shape_decoding_equals_target_generate(family, case, policy):
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy=policy, compile="shapes")
    assert torch.equal(spec.generate(**family.cases[case], max_new_tokens=32), family.reference(case))


def test_fixed_shape_decoding_equals_target_generate_with_pruning_and_a_masked_sage(qwen):
    from vlmspec import SageConfig

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy=SageConfig(fixed_shapes=True), compile="shapes")
    assert torch.equal(spec.generate(**qwen.cases["video"], max_new_tokens=32), qwen.reference("video"))


@pytest.mark.parametrize("policy", POLICIES)
def test_fixed_shape_batches_decode_every_row_as_its_own_generate(family, policy):
    """Every batched forward pads its rows to their bucket and its tokens to a padded size, and attends over the cache's
    capacity; two rows stop early, so the bucket shrinks as rows finish."""
    batch = padded_batch(family)
    eos = two_rows_eos(family)
    spec = SpeculativeVLM(family.target, family.drafts["noisy"], policy, compile="shapes")
    forwards = DecodingForwards(family.target)
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos)
    forwards.handle.remove()
    assert_rows_equal_their_own_generate(family, batch, out, ROWS, eos_token_id=eos)
    assert all(rows == row_bucket(rows) and tokens == padded_size(tokens) for rows, tokens, _, _ in forwards.seen)
    assert all(cache.fixed and span == cache.capacity for _, _, span, cache in forwards.seen)
    assert forwards.seen[0][0] == 4 and forwards.seen[-1][0] < 4


def test_compiled_batches_decode_every_row_as_its_own_generate(qwen):
    cases = ("image", "text")
    batch = padded_batch(qwen, cases)
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="chain", pruning=None, compile="on")
    out = spec.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert_rows_equal_their_own_generate(qwen, batch, out, cases)


def test_compiled_decoding_equals_target_generate(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="chain", pruning=None, compile="on")
    assert spec.compiled
    assert torch.equal(spec.generate(**qwen.cases["image"], max_new_tokens=16), qwen.reference("image", 16))


@pytest.mark.parametrize("setting, expected", [(True, "on"), (False, "off"), ("on", "on"), ("off", "off")])
def test_compile_settings_resolve(setting, expected):
    assert resolve_compile(setting) == expected


def test_auto_takes_the_environment_and_compiles_only_on_cuda_by_itself(monkeypatch, qwen):
    monkeypatch.setenv(COMPILE_ENV, "auto")
    assert resolve_compile("auto") == "auto"
    expected = qwen.target.device.type == "cuda"
    assert (compiled_forward(qwen.target, "auto", "target") is not None) == expected
    monkeypatch.setenv(COMPILE_ENV, "on")
    assert resolve_compile("auto") == "on"
    assert resolve_compile("off") == "off"


@pytest.mark.parametrize("setting", ["yes", 1.0])
def test_bad_compile_settings_are_refused_by_name(setting, qwen):
    with pytest.raises(ValueError, match="compile must be"):
        SpeculativeVLM(qwen.target, qwen.drafts["noisy"], compile=setting)


def test_a_bad_environment_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(COMPILE_ENV, "sometimes")
    with pytest.raises(ValueError, match=COMPILE_ENV):
        resolve_compile("auto")


def test_a_quantised_model_runs_eager_with_a_notice(monkeypatch, qwen, caplog):
    monkeypatch.setattr(qwen.drafts["noisy"], "is_quantized", True, raising=False)
    with caplog.at_level(logging.WARNING, logger="vlmspec.engine.compiled"):
        assert compiled_forward(qwen.drafts["noisy"], "on", "draft") is None
    assert "the draft runs eager: it is quantised" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vlmspec.engine.compiled"):
        compiled_forward(qwen.drafts["noisy"], "on", "draft")
    assert not caplog.text


def test_the_command_line_offers_the_librarys_compile_choices():
    from vlmspec import cli
    from vlmspec.engine.compiled import COMPILE_CHOICES

    assert cli.COMPILE_CHOICES == COMPILE_CHOICES
    args = cli.build_parser().parse_args(["generate", "hello", "--compile", "on"])
    assert cli.load_options(args)["compile"] == "on"


def test_compiled_batches_keep_their_cache_buffers_from_batch_to_batch(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="chain", compile="shapes")
    cases = ("image", "text")
    batch = padded_batch(qwen, cases)
    caches = []
    for max_new_tokens in (8, NEW_TOKENS):
        forwards = DecodingForwards(qwen.target)
        out = spec.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens)
        forwards.handle.remove()
        caches.append({id(cache): cache for *_, cache in forwards.seen})
    assert_rows_equal_their_own_generate(qwen, batch, out, cases)
    ((before,), (after,)) = (list(c.values()) for c in caches)
    assert after.fixed and after is not before
    assert [after.layer_slab(i)[0].data_ptr() for i in range(2)] == [
        before.layer_slab(i)[0].data_ptr() for i in range(2)
    ]


def test_copies_of_a_compiled_model_compile_their_own(qwen):
    import copy
    import pickle

    model = qwen.drafts["independent"]
    compiled = compiled_forward(model, "on", "draft")
    assert compiled_forward(model, "on", "draft") is compiled
    for duplicate in (copy.copy(model), copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert compiled_forward(duplicate, "on", "draft") is not compiled


def test_warm_up_runs_every_padded_size_once_then_decodes_and_leaves_decoding_exact(qwen):
    from vlmspec.engine.compiled import LARGEST_FORWARD, padded_sizes

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="sage", compile="shapes")
    sizes = []
    handle = qwen.target.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        assert spec.warm_up(32, **qwen.cases["image"]) > 0
    finally:
        handle.remove()
    warmed = padded_sizes(LARGEST_FORWARD)
    assert sizes[1 : 1 + len(warmed)] == warmed == [1, 2, 4, 8, 16, 32, 48, 64, 80]
    assert len(sizes) > 2 + len(warmed), "the warm-up then decodes (its prompt pass, then decoding forwards)"
    assert torch.equal(spec.generate(**qwen.cases["image"], max_new_tokens=32), qwen.reference("image"))


def test_a_sampled_warm_up_leaves_the_random_state_as_it_was(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="sage", compile="shapes")
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    spec.warm_up(8, generation={"do_sample": True, "temperature": 0.7}, **qwen.cases["image"])
    assert torch.equal(torch.rand(4), expected)


def test_warm_up_for_a_batch_runs_every_padded_size_over_every_row_bucket_it_meets(qwen):
    from vlmspec.engine.compiled import LARGEST_FORWARD, padded_sizes

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="sage", compile="shapes")
    shapes = set()
    handle = qwen.target.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.add(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        spec.warm_up(32, batch_size=3, **qwen.cases["image"])
    finally:
        handle.remove()
    assert {(rows, size) for rows in (1, 2, 4) for size in padded_sizes(LARGEST_FORWARD)} <= shapes
    assert torch.equal(spec.generate(**qwen.cases["image"], max_new_tokens=32), qwen.reference("image"))


def test_warm_up_does_nothing_for_eager_forwards(qwen):
    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], compile="off")
    assert spec.warm_up(32, **qwen.cases["image"]) == 0.0


def test_compiled_graphs_persist_under_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    model = tiny_qwen2_5_vl()
    assert compiled_forward(model, "on", "target") is not None
    assert os.environ[CACHE_ENV] == str(cache_folder()) == str(tmp_path / "vlmspec" / "inductor")


def test_after_a_warm_up_decoding_other_prompts_compiles_no_graph(qwen):
    from torch._dynamo.utils import counters

    spec = SpeculativeVLM(qwen.target, qwen.drafts["noisy"], policy="chain", pruning=None, compile="on")
    spec.warm_up(16, **qwen.cases["long_prompt"])
    before = counters["stats"]["unique_graphs"]
    for case in ("image", "video", "text"):
        assert torch.equal(spec.generate(**qwen.cases[case], max_new_tokens=16), qwen.reference(case, 16))
    assert counters["stats"]["unique_graphs"] == before
