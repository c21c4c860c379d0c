"""`compile="auto"` never costs a user their output: a compiled forward that fails to compile, or fails when its graph
runs again, turns the pair eager for good with one warning, and the call in flight still returns the target's own
`generate`; compiled forwards whose tokens differ from eager ones are caught once per model and fall back the same
way; `compile="on"` raises. Compilation is made to fail on purpose through a real `torch.compile` whose backend
raises, and `"auto"` is made to compile on the test device as it compiles on CUDA.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from conftest import DEVICE, device_map, on_device
from media_files import write_image

import vlmspec
from vlmspec import SpeculativeVLM
from vlmspec.adapters import adapter_for
from vlmspec.api import load_pair
from vlmspec.captioning import DEFAULT_PROMPTS, read_records
from vlmspec.cli import main
from vlmspec.engine import compiled
from vlmspec.engine.compiled import CHECK_TOKENS, COMPILE_ENV
from vlmspec.processors import load_image
from vlmspec.testing import chat_inputs, noisy_copy, sample_image, tiny_qwen2_5_vl
from vlmspec.testing.qwen2_5_vl import tiny_processor

LOGGER = "vlmspec.engine.compiled"
NEW_TOKENS = 24
REAL_COMPILE = torch.compile


@pytest.fixture
def auto_compiles_here(monkeypatch):
    """`compile="auto"` compiles on the test device, as it does on CUDA (whatever `pytest --compile` says)."""
    monkeypatch.setattr(compiled, "AUTO_DEVICE_TYPES", ("cuda", DEVICE.type))
    monkeypatch.setenv(COMPILE_ENV, "auto")


@pytest.fixture
def models():
    """A fresh tiny target and a noisy copy of it as draft: compiled forms and fallbacks stay with these two."""
    target = tiny_qwen2_5_vl().to(DEVICE)
    return target, noisy_copy(target, 0.05)


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


@pytest.fixture(scope="module")
def inputs(processor):
    return on_device(chat_inputs(processor, "Describe the image in detail.", images=[sample_image(0)]))


def planted_failure(fails: Callable[[torch.nn.Module], bool], at_run: int = 0) -> Callable:
    """A `torch.compile` whose backend raises for the models `fails` picks: while compiling (`at_run=0`), or when
    each compiled graph runs for the `at_run`-th time (as a CUDA graph's capture or first replay can). Other models
    compile through a backend that runs the traced graph as it is."""

    def compile(compiled, **kwargs):
        # A forward's compiled form is its model's `FixedForward`; the step's own functions are never made to fail.
        failing = fails(getattr(compiled, "model", None))

        def backend(graph, example_inputs):
            if failing and at_run == 0:
                raise RuntimeError("planted: the backend cannot compile this graph")
            runs = 0

            def run(*args):
                nonlocal runs
                runs += 1
                if failing and runs == at_run:
                    raise RuntimeError(f"planted: the graph fails on run {runs}")
                return graph.forward(*args)

            return run

        return REAL_COMPILE(compiled, backend=backend, dynamic=False)

    return compile


class Disagreeing(torch.nn.Module):
    """A 'compiled' forward (a model's `FixedForward`) that chooses other tokens than the model's own: every logit row
    is rolled by one token (a forward returns its logits and a head's outputs, None for a model). Counts its
    forwards."""

    def __init__(self, forward: torch.nn.Module, disagree: bool = True):
        super().__init__()
        self.forward_of = forward
        self.model = forward.model
        self.disagree = disagree
        self.calls = 0

    def forward(self, *args):
        self.calls += 1
        logits, hidden = self.forward_of(*args)
        return (logits.roll(1, dims=-1) if self.disagree else logits), hidden


def forwards_only(wrap: Callable) -> Callable:
    """A `torch.compile` that gives a model's forward (its `FixedForward`) to `wrap` and leaves the step's own
    functions uncompiled."""
    return lambda compiled, **kwargs: wrap(compiled) if hasattr(compiled, "model") else compiled


def warnings_in(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


@pytest.mark.usefixtures("auto_compiles_here")
@pytest.mark.parametrize("failing", ["target", "draft"])
@pytest.mark.parametrize("at_run", [0, 2], ids=["compiling", "running-again"])
def test_a_compiled_forward_that_fails_turns_the_pair_eager_and_the_call_stays_exact(
    monkeypatch, caplog, models, inputs, failing, at_run
):
    target, draft = models
    broken = target if failing == "target" else draft
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is broken, at_run))
    reference = target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
    spec = SpeculativeVLM(target, draft)
    assert spec.compiled
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert torch.equal(spec.generate(**inputs, max_new_tokens=NEW_TOKENS), reference)
        assert torch.equal(spec.generate(**inputs, max_new_tokens=NEW_TOKENS), reference)
    assert not spec.compiled
    (warning,) = warnings_in(caplog)
    assert f"the {failing}'s compiled" in warning and "planted: the" in warning
    assert "target and draft run eager" in warning and 'compile="on"' in warning


@pytest.mark.usefixtures("auto_compiles_here")
def test_other_wrappers_of_a_pair_that_fell_back_run_eager_without_a_second_warning(
    monkeypatch, caplog, models, inputs
):
    target, draft = models
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is not None))
    spec = SpeculativeVLM(target, draft)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        spec.generate(**inputs, max_new_tokens=4)
        other = spec.with_options("chain")
        assert not other.compiled
        other.generate(**inputs, max_new_tokens=4)
    assert len(warnings_in(caplog)) == 1


def test_compile_on_raises_what_the_compiled_forward_raised(monkeypatch, models, inputs):
    target, draft = models
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is target))
    spec = SpeculativeVLM(target, draft, compile="on")
    with pytest.raises(Exception, match="planted: the backend cannot compile"):
        spec.generate(**inputs, max_new_tokens=4)


@pytest.mark.usefixtures("auto_compiles_here")
def test_compile_on_raises_even_after_auto_fell_back(monkeypatch, models, inputs):
    target, draft = models
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is target))
    SpeculativeVLM(target, draft).generate(**inputs, max_new_tokens=4)
    with pytest.raises(Exception, match="planted: the backend cannot compile"):
        SpeculativeVLM(target, draft, compile="on").generate(**inputs, max_new_tokens=4)


@pytest.mark.usefixtures("auto_compiles_here")
@pytest.mark.parametrize("rows, disagreeing", [(1, "target"), (2, "draft")], ids=["one-sequence", "batch"])
def test_compiled_forwards_that_choose_other_tokens_than_eager_are_caught_before_decoding(
    monkeypatch, caplog, models, inputs, processor, rows, disagreeing
):
    target, draft = models
    odd = target if disagreeing == "target" else draft
    monkeypatch.setattr(torch, "compile", forwards_only(lambda forward: Disagreeing(forward, forward.model is odd)))
    prompts = [inputs, on_device(chat_inputs(processor, "What is shown here?"))][:rows]
    batch = on_device(adapter_for(target).join_rows(prompts, processor.tokenizer.pad_token_id)) if rows > 1 else inputs
    reference = target.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS)
    spec = SpeculativeVLM(target, draft)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert torch.equal(spec.generate(**batch, max_new_tokens=NEW_TOKENS), reference)
    assert not spec.compiled
    (warning,) = warnings_in(caplog)
    expected = f"the {disagreeing}'s compiled forwards chose other tokens than its eager ones"
    assert f"{expected} on a {CHECK_TOKENS}-token" in warning
    assert 'compile="on"' in warning and "run it compiled regardless" in warning


@pytest.mark.usefixtures("auto_compiles_here")
def test_compiled_forwards_that_agree_with_eager_are_checked_once_per_model_and_keep_running(
    monkeypatch, caplog, models, inputs
):
    target, draft = models
    built = {}

    def compile(forward):
        built[forward.model] = Disagreeing(forward, disagree=False)
        return built[forward.model]

    monkeypatch.setattr(torch, "compile", forwards_only(compile))
    reference = target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
    spec = SpeculativeVLM(target, draft, "chain")
    calls = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for wrapper in (spec, spec, spec.with_options("chain")):
            before = built[target].calls
            assert torch.equal(wrapper.generate(**inputs, max_new_tokens=NEW_TOKENS), reference)
            calls.append(built[target].calls - before)
    assert spec.compiled and not warnings_in(caplog)
    check = CHECK_TOKENS + 1
    assert calls[0] - check == calls[1] == calls[2]


@pytest.mark.usefixtures("auto_compiles_here")
def test_a_padded_batch_and_a_stream_decode_exactly_on_a_pair_whose_compilation_fails(
    monkeypatch, models, inputs, processor
):
    target, draft = models
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is not None))
    spec = SpeculativeVLM(target, draft)
    text = on_device(chat_inputs(processor, "What is shown here?"))
    rows = [inputs, text]
    batch = on_device(adapter_for(target).join_rows(rows, processor.tokenizer.pad_token_id))
    expected = target.generate(**batch, do_sample=False, max_new_tokens=NEW_TOKENS)
    assert torch.equal(spec.generate(**batch, max_new_tokens=NEW_TOKENS), expected)
    for batch_size in (1, 2):
        results = {r.key: r.sequence for r in spec.stream(enumerate(rows), batch_size, max_new_tokens=NEW_TOKENS)}
        for key, row in enumerate(rows):
            alone = target.generate(**row, do_sample=False, max_new_tokens=NEW_TOKENS)
            assert torch.equal(results[key], alone), (batch_size, key)
    assert not spec.compiled


@pytest.fixture
def saved_pair(tmp_path, models, processor) -> tuple[str, str]:
    """The fresh pair written as `save_pretrained` directories (the target's with its processor)."""
    target, draft = models
    target.save_pretrained(tmp_path / "target")
    processor.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    processor.tokenizer.save_pretrained(tmp_path / "draft")
    return str(tmp_path / "target"), str(tmp_path / "draft")


@pytest.fixture
def image_file(tmp_path) -> str:
    return str(write_image(tmp_path / "photo.png", seed=4))


def own_caption(saved_pair, image_file, prompt, max_new_tokens) -> str:
    """The target's own greedy `generate` on the prompt and image, decoded."""
    spec = load_pair(*saved_pair, device_map=device_map(), compile="off")
    inputs = on_device(dict(spec.processor.prompt_inputs(prompt, [load_image(image_file)], [], [image_file])))
    ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return spec.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


@pytest.mark.usefixtures("auto_compiles_here")
def test_vlmspec_generate_falls_back_and_returns_the_targets_own_text(monkeypatch, caplog, saved_pair, image_file):
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is not None))
    prompt = "Describe the image in detail."
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        text = vlmspec.generate(prompt, images=image_file, model=saved_pair[0], draft=saved_pair[1], max_new_tokens=12)
        again = vlmspec.generate(prompt, images=image_file, model=saved_pair[0], draft=saved_pair[1], max_new_tokens=12)
    assert text == again == own_caption(saved_pair, image_file, prompt, 12)
    assert len(warnings_in(caplog)) == 1


@pytest.mark.usefixtures("auto_compiles_here")
@pytest.mark.parametrize("batch_size", ["1", "2"])
def test_caption_falls_back_and_writes_the_targets_own_captions(
    monkeypatch, caplog, capsys, saved_pair, image_file, tmp_path, batch_size
):
    monkeypatch.setattr(torch, "compile", planted_failure(lambda model: model is not None))
    second = str(write_image(tmp_path / "second.png", seed=5))
    out = tmp_path / "captions.jsonl"
    pair = ["--model", saved_pair[0], "--draft", saved_pair[1], "--device", str(DEVICE)]
    args = ["caption", image_file, second, "--out", str(out), *pair, "--max-new-tokens", "10", "--no-progress"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        main([*args, "--batch-size", batch_size])
    records = {r["path"]: r for r in read_records(out)}
    prompt = DEFAULT_PROMPTS["image"]
    for path in (image_file, second):
        assert records[path]["caption"] == own_caption(saved_pair, path, prompt, 10), path
    assert len(warnings_in(caplog)) == 1
