"""The command line: generation flags reach generate, --seed makes sampling repeat, --dtype reaches loading, errors
end with their exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import save_pair
from media_files import write_image
from transformers import GenerationConfig

from vlmspec.api import load_pair
from vlmspec.captioning import read_records
from vlmspec.cli import EXIT_CONFIGURATION, EXIT_ERROR, build_parser, generation_options, load_options, main
from vlmspec.testing.released_files import QWEN3_VL_GENERATION

PROMPT = "Describe the image in detail."
#: Qwen3-VL-Instruct's released settings: they sample from up to 20 tokens.
SAMPLING = {k: QWEN3_VL_GENERATION[k] for k in ("do_sample", "top_k", "top_p", "temperature", "repetition_penalty")}


@pytest.fixture(scope="module")
def pair(qwen, tmp_path_factory):
    return save_pair(qwen, tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def sampling_pair(qwen, tmp_path_factory):
    """The same pair, shipped with Qwen3-VL-Instruct's sampling generation config."""
    model, draft = save_pair(qwen, tmp_path_factory.mktemp("sampling_pair"))
    config = GenerationConfig.from_pretrained(model)
    config.update(**SAMPLING)
    config.save_pretrained(model)
    return model, draft


@pytest.fixture(scope="module")
def early_eos_pair(qwen, tmp_path_factory):
    """The same pair, whose end-of-sequence token is one its greedy text reaches after a few tokens."""
    new = qwen.reference("text", 24)[0, qwen.cases["text"]["input_ids"].shape[1] :].tolist()
    eos = next(token for i, token in enumerate(new) if i >= 3 and token not in new[:i])
    model, draft = save_pair(qwen, tmp_path_factory.mktemp("early_eos_pair"))
    config = GenerationConfig.from_pretrained(model)
    config.update(eos_token_id=eos)
    config.save_pretrained(model)
    return model, draft, eos


def generate_text(pair, *flags: str, max_new_tokens: int = 24) -> list[str]:
    """`vlmspec generate` arguments for a text-only prompt to `pair`."""
    return ["generate", PROMPT, "--model", pair[0], "--draft", pair[1], "--max-new-tokens", str(max_new_tokens), *flags]


def reference_text(qwen, max_new_tokens: int = 24, **generation) -> str:
    """The target's own greedy `generate` on the same prompt, decoded as the command line prints it."""
    ids = qwen.reference("text", max_new_tokens, **generation)
    length = qwen.cases["text"]["input_ids"].shape[1]
    return qwen.processor.tokenizer.decode(ids[0, length:], skip_special_tokens=True)


def printed(capsys, argv: list[str]) -> str:
    main(argv)
    return capsys.readouterr().out.removesuffix("\n")


def exit_code(capsys, argv: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    return exited.value.code, capsys.readouterr().err


def test_generate_prints_the_targets_greedy_text(qwen, pair, capsys):
    assert printed(capsys, generate_text(pair)) == reference_text(qwen)


def test_a_sampling_generation_config_prints_the_same_sample_for_the_same_seed(qwen, sampling_pair, capsys):
    sampled = printed(capsys, generate_text(sampling_pair, "--seed", "3", max_new_tokens=8))
    assert sampled != reference_text(qwen, max_new_tokens=8)
    assert printed(capsys, generate_text(sampling_pair, "--seed", "3", max_new_tokens=8)) == sampled


def test_greedy_overrides_a_sampling_generation_config(qwen, sampling_pair, capsys):
    assert printed(capsys, generate_text(sampling_pair, "--greedy")) == reference_text(qwen)


def test_repetition_penalty_reaches_generate(qwen, pair, capsys):
    penalised = printed(capsys, generate_text(pair, "--repetition-penalty", "1.3"))
    assert penalised == reference_text(qwen, repetition_penalty=1.3)
    assert penalised != printed(capsys, generate_text(pair, "--repetition-penalty", "1.0"))


def test_min_new_tokens_reaches_generate(qwen, early_eos_pair, capsys):
    model, draft, eos = early_eos_pair
    longer = printed(capsys, generate_text((model, draft), "--min-new-tokens", "20"))
    assert longer == reference_text(qwen, eos_token_id=eos, min_new_tokens=20)
    assert len(longer) > len(printed(capsys, generate_text((model, draft))))


def test_a_stop_string_ends_the_printed_text_where_generate_ends_it(qwen, pair, capsys):
    tokenizer = qwen.processor.tokenizer
    new = qwen.reference("text", 24)[0, qwen.cases["text"]["input_ids"].shape[1] :].tolist()
    stop = next(t for t in (tokenizer.decode([i]) for i in new[6:]) if t.strip().isalnum())
    stopped = printed(capsys, generate_text(pair, "--stop", stop, "--stop", "never seen"))
    assert stopped == reference_text(qwen, stop_strings=(stop, "never seen"), tokenizer=tokenizer)
    assert len(stopped) < len(reference_text(qwen))


def test_only_the_flags_given_reach_generate():
    args = build_parser().parse_args(["generate", PROMPT, "--greedy", "--top-k", "0", "--seed", "4"])
    assert generation_options(args) == {"do_sample": False, "top_k": 0}
    assert generation_options(build_parser().parse_args(["generate", PROMPT])) == {}


@pytest.mark.parametrize("command", ["generate", "caption"])
def test_dtype_flag_loads_the_pair_in_that_dtype(pair, command):
    positional = [PROMPT] if command == "generate" else ["media", "--out", "captions.jsonl"]
    args = build_parser().parse_args(
        [command, *positional, "--model", pair[0], "--draft", pair[1], "--dtype", "bfloat16"]
    )
    spec = load_pair(**load_options(args))
    assert spec.target.dtype == spec.draft.dtype == torch.bfloat16


def test_without_dtype_flag_the_library_default_applies(pair):
    args = build_parser().parse_args(["generate", PROMPT, "--model", pair[0], "--draft", pair[1]])
    assert load_options(args)["torch_dtype"] is None


def test_generate_runs_in_bfloat16(pair, capsys):
    assert printed(capsys, generate_text(pair, "--dtype", "bfloat16", max_new_tokens=8))


@pytest.mark.parametrize(
    "flags", [["--temperature", "0"], ["--top-p", "1.5"], ["--top-k", "-1"], ["--dtype", "float64"]]
)
def test_out_of_range_settings_are_refused_before_loading(pair, flags, capsys):
    code, err = exit_code(capsys, generate_text(pair, *flags))
    assert code == EXIT_CONFIGURATION and flags[0] in err


def test_an_unknown_device_is_refused_naming_the_flag(pair, capsys):
    code, err = exit_code(capsys, generate_text(pair, "--device", "gpu7"))
    assert code == EXIT_CONFIGURATION and "--device 'gpu7'" in err


def test_device_flag_places_the_pair(pair, capsys):
    assert printed(capsys, generate_text(pair, "--device", "cpu", max_new_tokens=4))
    assert load_pair(pair[0], pair[1], device_map={"": "cpu"}).target.device.type == "cpu"


def test_a_missing_image_exits_1_with_its_message(pair, tmp_path, capsys):
    code, err = exit_code(capsys, generate_text(pair, "--image", str(tmp_path / "missing.png")))
    assert code == EXIT_ERROR and "MediaNotFoundError" in err and "missing.png" in err


def test_retry_errors_needs_resume(capsys):
    code, err = exit_code(capsys, ["caption", "media", "--out", "captions.jsonl", "--retry-errors"])
    assert code == EXIT_CONFIGURATION and "--resume" in err


def caption_argv(pair, inputs: list[str], out: Path, *flags: str) -> list[str]:
    model = ["--model", pair[0], "--draft", pair[1], "--max-new-tokens", "8"]
    return ["caption", *inputs, "--out", str(out), *model, "--no-progress", *flags]


def test_caption_with_a_seed_writes_the_same_captions_when_resumed(sampling_pair, tmp_path):
    images = [str(write_image(tmp_path / f"img{i}.png", seed=i)) for i in range(2)]
    first, resumed = tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"
    main(caption_argv(sampling_pair, images, first, "--seed", "3"))
    resumed.write_text(first.read_text().splitlines(keepends=True)[0])
    main(caption_argv(sampling_pair, images, resumed, "--seed", "3", "--resume"))
    assert [r["caption"] for r in read_records(resumed)] == [r["caption"] for r in read_records(first)]


def test_bench_sampling_flags_become_the_generation_settings_of_every_method():
    flags = ["--do-sample", "--temperature", "0.7", "--top-k", "20", "--top-p", "0.8", "--repetition-penalty", "1.1"]
    args = build_parser().parse_args(["bench", *flags])
    assert generation_options(args) == {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
        "repetition_penalty": 1.1,
    }
    assert generation_options(build_parser().parse_args(["bench"])) == {}


def test_bench_refuses_sampling_settings_without_do_sample(capsys):
    code, err = exit_code(capsys, ["bench", "--temperature", "0.7"])
    assert code == EXIT_CONFIGURATION and "--do-sample" in err


def test_bench_refuses_repeats_without_batch_sizes(capsys):
    code, err = exit_code(capsys, ["bench", "--repeats", "3"])
    assert code == EXIT_CONFIGURATION and "--batch-size" in err
