"""`vlmspec train-draft` on a tiny pair: it trains by distillation and by VSD, saves a draft that loads with
`from_pretrained` and decodes exactly, keeps every response it wrote across a resumed run, records unreadable media
and refuses what it cannot train on, by name, before training."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAMILIES, save_pair
from media_files import write_sample_images

from vlmspec import InvalidArgumentError, SpeculativeVLM, VocabularyMismatchError
from vlmspec.training import TrainSettings, VSDConfig, train_draft
from vlmspec.training.data import read_items
from vlmspec.training.responses import prepared_items

FAMILY = FAMILIES["qwen2_5_vl"]


@pytest.fixture
def pair(tmp_path):
    target, draft = save_pair(FAMILY, tmp_path, "noisy")
    return target, draft, write_sample_images(tmp_path / "data")


def _settings(pair, out, **changes) -> TrainSettings:
    target, draft, data = pair
    base = dict(target=target, draft=draft, data=str(data), out=str(out), steps=2, max_new_tokens=8)
    return TrainSettings(**{**base, **changes})


def _log(out) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("objective", ["kd", "vsd"])
def test_a_trained_draft_loads_and_decodes_exactly_as_the_targets_generate(pair, tmp_path, objective):
    out = tmp_path / objective
    vsd = VSDConfig(samples=3, length=2, anchors=1)
    folder = train_draft(_settings(pair, out, objective=objective, vsd=vsd, eval_every=2, eval_items=1))
    records = _log(out)
    assert [r["step"] for r in records] == [1, 2] and all(r["loss"] == r["loss"] for r in records)
    assert all(("vsd" in r) == (objective == "vsd") for r in records)
    evaluation = json.loads((out / "eval.jsonl").read_text().splitlines()[-1])
    assert evaluation["exact"] == 1.0 and (out / "eval.png").stat().st_size > 0
    spec = SpeculativeVLM.from_pretrained(pair[0], str(folder), compile="off")
    inputs = FAMILY.cases["image"]
    assert torch.equal(spec.generate(**inputs, max_new_tokens=12), FAMILY.reference("image", 12))


def test_a_resumed_run_goes_on_from_its_checkpoint_and_writes_no_response_again(pair, tmp_path):
    out = tmp_path / "run"
    train_draft(_settings(pair, out, steps=2, checkpoint_every=1))
    responses = (out / "responses-0.jsonl").read_text()
    train_draft(_settings(pair, out, steps=4, checkpoint_every=1), resume=True)
    assert [r["step"] for r in _log(out)] == [1, 2, 3, 4]
    assert (out / "responses-0.jsonl").read_text() == responses


def test_a_resume_with_other_settings_is_refused_naming_them(pair, tmp_path):
    out = tmp_path / "run"
    train_draft(_settings(pair, out))
    with pytest.raises(InvalidArgumentError, match="objective, lr"):
        train_draft(_settings(pair, out, objective="vsd", lr=1e-3), resume=True)
    with pytest.raises(InvalidArgumentError, match="--resume"):
        train_draft(_settings(pair, out))


def test_an_unreadable_medium_is_recorded_and_the_others_train(pair, tmp_path):
    (pair[2] / "broken.png").write_bytes(b"not an image")
    out = tmp_path / "run"
    train_draft(_settings(pair, out))
    records = [json.loads(line) for line in (out / "responses-0.jsonl").read_text().splitlines()]
    assert [r["key"] for r in records if "error" in r] == ["broken.png"]
    assert "NotAnImageError" in next(r["error"] for r in records if "error" in r)
    assert sum("response_ids" in r for r in records) == 4


def test_a_pair_whose_tokenizers_differ_is_refused_before_training(pair, tmp_path):
    target, draft, data = pair
    vocabulary = json.loads((tmp_path / "draft" / "tokenizer.json").read_text())
    vocab = vocabulary["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[5:7]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (tmp_path / "draft" / "tokenizer.json").write_text(json.dumps(vocabulary))
    with pytest.raises(VocabularyMismatchError):
        train_draft(_settings(pair, tmp_path / "run"))
    assert not (tmp_path / "run" / "log.jsonl").exists()


def test_jsonl_rows_give_media_prompts_and_responses_and_bad_rows_are_named(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"media": "a.png", "prompt": "What is it?", "response": "A cat."}\n\n{"prompt": "Hi"}\n')
    items = read_items(good)
    assert [(i.media, i.prompt, i.response) for i in items] == [
        ((str(tmp_path / "a.png"),), "What is it?", "A cat."),
        ((), "Hi", None),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"media": 3, "prompt": "x"}\n')
    with pytest.raises(InvalidArgumentError, match="line 2: media"):
        read_items(bad)


def test_a_resumed_runs_log_goes_on_from_its_checkpoint(pair, tmp_path):
    """A kill after step 2's checkpoint left step 3's record and half of step 4's: the resumed run writes them anew."""
    out = tmp_path / "run"
    train_draft(_settings(pair, out, steps=2, checkpoint_every=2))
    with (out / "log.jsonl").open("a") as log:
        log.write(json.dumps({"step": 3, "loss": 1.0}) + '\n{"step": 4, "lo')
    train_draft(_settings(pair, out, steps=4, checkpoint_every=2), resume=True)
    assert [r["step"] for r in _log(out)] == [1, 2, 3, 4]


def test_bad_data_is_refused_before_the_run_writes_anything(pair, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"media": 3, "prompt": "x"}\n')
    out = tmp_path / "run"
    with pytest.raises(InvalidArgumentError, match="line 1: media"):
        train_draft(_settings(pair, out, data=str(bad)))
    assert not out.exists()


def test_a_sampled_target_writes_the_same_responses_in_every_run(pair, tmp_path, monkeypatch):
    target, _, data = pair
    model = FAMILY.target
    monkeypatch.setattr(model.generation_config, "do_sample", True)
    monkeypatch.setattr(model.generation_config, "top_k", 0)
    items = read_items(data)
    written = []
    for run in ("first", "second"):
        cache = tmp_path / run / "responses-0.jsonl"
        written.append([p.response.tolist() for p in prepared_items(items, FAMILY.processor, model, cache, 12, seed=3)])
    assert written[0] == written[1]
    other = [p.response.tolist() for p in prepared_items(items, FAMILY.processor, model, tmp_path / "o.jsonl", 12, 4)]
    assert other != written[0]
