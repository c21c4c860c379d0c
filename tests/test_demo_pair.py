"""The bundled demo pair: installed with the package, loadable, and exact on its sample media."""

from __future__ import annotations

import json

import torch

import vlmspec
from vlmspec.cli import main
from vlmspec.demo_models import DEMO_DIR, demo_head, demo_pair
from vlmspec.processors import chat_messages, load_image, load_video


def test_the_demo_pair_is_bundled_within_the_size_budget():
    assert demo_pair() is not None
    size = sum(f.stat().st_size for f in DEMO_DIR.rglob("*") if f.is_file())
    assert size < 60 * 2**20
    log = json.loads((DEMO_DIR / "training_log.json").read_text())
    accuracy = log["held_out_accuracy"]["target"]
    assert all(accuracy[suite]["colour_recall"] > 0 for suite in ("image", "video", "long-video"))


def test_the_demo_pair_decodes_its_samples_exactly():
    spec = vlmspec.load_pair()
    assert spec.target.dtype == torch.float32
    processor = spec.processor
    cases = [
        ("Describe the image in detail.", {"images": [load_image(DEMO_DIR / "samples" / "sample.png")]}),
        ("Describe the video in detail.", {"videos": [load_video(DEMO_DIR / "samples" / "sample.mp4")]}),
    ]
    for prompt, media in cases:
        messages = chat_messages(prompt, len(media.get("images", [])), len(media.get("videos", [])))
        inputs = processor(processor.apply_chat_template(messages), **media)
        expected = spec.target.generate(**inputs, do_sample=False, max_new_tokens=40)
        assert torch.equal(spec.generate(**inputs, max_new_tokens=40), expected)


def test_the_demo_head_ships_in_the_released_layout_and_the_demo_drafts_with_it_exactly(capsys):
    config = json.loads((DEMO_DIR / "head" / "config.json").read_text())
    assert demo_head() is not None and config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["torch_dtype"] == "bfloat16" and config["hidden_size"] == 512
    main(["demo", "--head", "--max-new-tokens", "24"])
    out = capsys.readouterr().out
    assert f"draft {demo_head()}" in out and out.count("identical to plain generate: True") == 2
