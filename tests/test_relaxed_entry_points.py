"""Relaxed verification at every entry point, labelled wherever its output goes: the caption records, the server's
`vlmspec` extension (and its refusal without `--allow-lossy`), the bench's exact column and quality table; and the
command line's refusals of settings without `--verification relaxed`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from media_files import write_image
from openai import BadRequestError, OpenAI
from serving import RunningServer, image_part, sent, with_path
from test_relaxed_verification import teacher_forced_differences

from vlmspec import RelaxedVerification, SpeculativeVLM
from vlmspec.api import load_pair
from vlmspec.captioning import CaptionSettings, read_records, run_captioning
from vlmspec.cli import build_parser, main, relaxed_grid
from vlmspec.demo_models import demo_head, demo_pair
from vlmspec.eval.batch_bench import markdown_batch_report, run_batch_bench
from vlmspec.eval.bench import markdown_report, run_bench
from vlmspec.processors import load_image
from vlmspec.serve.app import ServerOptions
from vlmspec.serve.chat import ServeLimits
from vlmspec.testing import chat_inputs

pytestmark = pytest.mark.skipif(demo_pair() is None, reason="the bundled demo pair is not installed")
pytest.importorskip("sacrebleu")
pytest.importorskip("rouge_score")

WIDE = RelaxedVerification(tau_base=2.0, gamma=2.0, top_beta=5)
NAME = "vlmspec-demo"


@pytest.fixture(scope="module")
def spec():
    return load_pair().with_options("chain")


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    return write_image(tmp_path_factory.mktemp("media") / "photo.png", size=(64, 64), seed=3)


def test_caption_records_say_relaxed_and_count_the_tokens_that_differ(spec, photo, tmp_path):
    out = tmp_path / "captions.jsonl"
    lossy = spec.with_options("chain", verification=WIDE)
    run_captioning(lambda state: lossy, [str(photo)], out, CaptionSettings(max_new_tokens=24), progress=False)
    (record,) = read_records(out)
    assert record["verification"] == WIDE.label and record["differing_tokens"] >= 0
    exact_out = tmp_path / "exact.jsonl"
    run_captioning(lambda state: spec, [str(photo)], exact_out, CaptionSettings(max_new_tokens=24), progress=False)
    assert "verification" not in read_records(exact_out)[0]


def chat(photo: Path) -> list[dict]:
    return sent([{"role": "user", "content": [with_path(image_part(photo), photo), {"type": "text", "text": "Hi"}]}])


def test_the_server_refuses_relaxed_requests_unless_started_with_allow_lossy(spec, photo):
    server = RunningServer(spec.with_options("chain"), ServerOptions(NAME), batch_size=2)
    try:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        with pytest.raises(BadRequestError, match="--allow-lossy") as refused:
            client.chat.completions.create(
                model=NAME, messages=chat(photo), max_tokens=8, temperature=0, extra_body={"verification": "relaxed"}
            )
        assert refused.value.body["param"] == "verification"
        answer = client.chat.completions.create(model=NAME, messages=chat(photo), max_tokens=8, temperature=0)
        assert answer.model_extra["vlmspec"]["verification"] == "exact"
    finally:
        server.close()


def test_an_allowed_relaxed_request_is_labelled_in_the_vlmspec_extension(spec, photo):
    options = ServerOptions(NAME, limits=ServeLimits(allow_lossy=True))
    server = RunningServer(spec.with_options("chain"), options, batch_size=2)
    try:
        client = OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        settings = {"tau_base": 2.0, "gamma": 2.0, "top_beta": 5}
        answer = client.chat.completions.create(
            model=NAME, messages=chat(photo), max_tokens=24, temperature=0, extra_body={"verification": settings}
        )
        extension = answer.model_extra["vlmspec"]
        assert extension["verification"] == WIDE.label and extension["differing_tokens"] >= 0
    finally:
        server.close()


def test_the_bench_labels_relaxed_methods_and_measures_their_quality(spec):
    results = run_bench(spec, "image", ["auto"], n=2, max_new_tokens=24, progress=False, verifications=[WIDE])
    relaxed = results["methods"]["auto relaxed(2,2,b5,formula)"]
    assert relaxed["verification"] == WIDE.label
    quality = results["quality"]
    assert quality["ar"]["bleu"] == pytest.approx(100.0) and quality["auto"]["rouge_l"] == pytest.approx(100.0)
    assert quality["auto relaxed(2,2,b5,formula)"]["differing_tokens"] == relaxed["differing_tokens"]
    report = markdown_report(results, "vlmspec bench --verification relaxed")
    assert f"relaxed, {relaxed['exact_match']:.2f} ({relaxed['differing_tokens']} tokens differ)" in report
    assert "| method | count accuracy | pair recall | BLEU | ROUGE-L | differing tokens |" in report


def test_the_batched_bench_measures_relaxed_methods_beside_plain_generate(spec):
    results = run_batch_bench(spec, "image", ["chain"], 2, 12, [2], progress=False, verifications=[WIDE])
    name = "chain relaxed(2,2,b5,formula)"
    assert set(results["quality"][2]) == {"generate", "chain", name}
    assert results["table"][name][2]["verification"] == WIDE.label and "tau" in results["table"][name][2]
    assert "tokens differ" in markdown_batch_report(results, "vlmspec bench --batch-size 2 --verification relaxed")


def test_the_bench_grid_takes_settings_in_step_under_every_direction():
    args = build_parser().parse_args(
        ["bench", "--verification", "relaxed", "--tau-base", "0.1,0.5", "--gamma", "1", "--direction", "formula,prose"]
    )
    grid = relaxed_grid(args)
    assert [(v.tau_base, v.gamma, v.direction) for v in grid] == [
        (0.1, 1.0, "formula"),
        (0.1, 1.0, "prose"),
        (0.5, 1.0, "formula"),
        (0.5, 1.0, "prose"),
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "hi", "--tau-base", "0.3"], "--tau-base set relaxed verification: add --verification relaxed"),
        (["serve", "--verification", "relaxed"], "add --allow-lossy"),
    ],
)
def test_the_command_line_refuses_relaxed_settings_it_was_not_asked_for(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


def test_a_relaxed_pair_keeps_the_models_it_was_made_from(spec):
    lossy = spec.with_options("sage", verification="relaxed")
    assert isinstance(lossy, SpeculativeVLM) and lossy.target is spec.target
    assert lossy.verification == RelaxedVerification()


def test_a_draft_head_verifies_relaxed_too(photo):
    pair = load_pair(demo_pair()[0], demo_head()).with_options("sage")
    inputs = chat_inputs(pair.processor, "Describe the image.", images=[load_image(photo)])
    exact = pair.target.generate(**inputs, max_new_tokens=32)
    zero = RelaxedVerification(tau_base=0.0, gamma=0.0, top_beta=1)
    assert torch.equal(pair.generate(**inputs, max_new_tokens=32, verification=zero), exact)
    lossy = pair.generate(**inputs, max_new_tokens=32, verification=WIDE)
    assert pair.last_stats.verification == WIDE.label
    assert pair.last_stats.differing_tokens == teacher_forced_differences(pair.target, inputs, lossy)
