"""The demo target with a draft head in place of the demo draft (a random head at the demo target's size, saved in
the released layout, reading its default layers) through `vlmspec demo`, `caption`, `serve` and `bench`: every output
is the target's own."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2_5_VLForConditionalGeneration

from vlmspec.api import load_pair
from vlmspec.captioning import DEFAULT_PROMPTS
from vlmspec.cli import main
from vlmspec.demo_models import DEMO_DIR, demo_pair
from vlmspec.heads import save_head
from vlmspec.processors import load_image, load_video
from vlmspec.testing.heads import random_head

IMAGE, VIDEO = DEMO_DIR / "samples" / "sample.png", DEMO_DIR / "samples" / "sample.mp4"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    """The demo target's folder and a random head's for it."""
    target_dir = demo_pair()[0]
    target = Qwen2_5_VLForConditionalGeneration.from_pretrained(target_dir, dtype=torch.float32)
    return target_dir, str(save_head(random_head(target, seed=3), tmp_path_factory.mktemp("head")))


@pytest.fixture(scope="module")
def reference(pair):
    """The target's own greedy text for the sample image and video (4 frames), with the captioner's prompts."""
    spec = load_pair(*pair)
    texts = {}
    for path, media in ((IMAGE, ([load_image(IMAGE)], [])), (VIDEO, ([], [load_video(VIDEO, num_frames=4)]))):
        prompt = DEFAULT_PROMPTS["image" if path == IMAGE else "video"]
        inputs = spec.processor.prompt_inputs(prompt, *media, [str(path)])
        ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=NEW_TOKENS)
        texts[str(path)] = spec.processor.tokenizer.decode(
            ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True
        )
    return texts


def test_the_demo_runs_a_head_in_place_of_the_demo_draft(pair, capsys):
    main(["demo", "--draft", pair[1], "--max-new-tokens", str(NEW_TOKENS)])
    out = capsys.readouterr().out
    assert f"draft {pair[1]}" in out
    assert out.count("identical to plain generate: True") == 2


def test_caption_with_a_head_records_the_targets_own_text_at_batch_size_2(pair, reference, tmp_path):
    out = tmp_path / "captions.jsonl"
    flags = ["--model", pair[0], "--draft", pair[1], "--num-frames", "4", "--batch-size", "2"]
    main(["caption", str(IMAGE), str(VIDEO), "--out", str(out), "--no-progress", *flags, "--max-new-tokens", "16"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["path"]: r["caption"] for r in records} == reference


def test_serve_with_a_head_answers_with_the_targets_own_text(pair, reference):
    from openai import OpenAI
    from serving import RunningServer, data_url

    from vlmspec.serve.app import ServerOptions

    running = RunningServer(load_pair(*pair).with_options(), ServerOptions("demo"), batch_size=2)
    try:
        client = OpenAI(base_url=running.url, api_key="unused", max_retries=0)
        image = {"type": "image_url", "image_url": {"url": data_url(IMAGE, "image")}}
        messages = [{"role": "user", "content": [image, {"type": "text", "text": DEFAULT_PROMPTS["image"]}]}]
        answer = client.chat.completions.create(model="demo", messages=messages, max_tokens=NEW_TOKENS)
        assert answer.choices[0].message.content == reference[str(IMAGE)]
    finally:
        running.close()


def test_bench_with_a_head_decodes_every_item_as_plain_generate(pair, tmp_path):
    flags = ["--model", pair[0], "--draft", pair[1], "--suite", "image", "--methods", "ar,chain,sage", "--n", "2"]
    main(["bench", *flags, "--max-new-tokens", "16", "--out", str(tmp_path)])
    methods = json.loads((tmp_path / "results.json").read_text())["methods"]
    assert methods["chain"]["exact_match"] == methods["sage"]["exact_match"] == 1.0
    assert methods["sage"]["tau"] is not None
