"""`vlmspec.generate` end to end: files in, the target's own greedy text out."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILIES, save_pair
from media_files import write_image, write_video

import vlmspec
from vlmspec import ContextTooLongError, SpeculativeVLM, VocabularyMismatchError
from vlmspec.processors import chat_messages, load_image, load_video
from vlmspec.testing import build_tokenizer


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return save_pair(FAMILIES["qwen2_5_vl"], tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    return {"image": write_image(root / "photo.jpg"), "video": write_video(root / "clip.mp4", size=(64, 96))}


def expected_text(pair_dirs, prompt, images=(), videos=(), max_new_tokens=24):
    """The loaded target's own greedy output on the same processed inputs."""
    spec = vlmspec.load_pair(*pair_dirs)
    processor = spec.processor
    inputs = processor(
        processor.apply_chat_template(chat_messages(prompt, len(images), len(videos))),
        images=list(images),
        videos=list(videos),
    )
    ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens)
    return processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_generate_describes_an_image_file(pair_dirs, media):
    text = vlmspec.generate(
        "Describe the image in detail.",
        images=media["image"],
        model=pair_dirs[0],
        draft=pair_dirs[1],
        max_new_tokens=24,
    )
    assert text == expected_text(pair_dirs, "Describe the image in detail.", images=[load_image(media["image"])])


def test_generate_describes_a_video_file(pair_dirs, media):
    text, stats = vlmspec.generate(
        "Describe the video in detail.",
        videos=media["video"],
        model=pair_dirs[0],
        draft=pair_dirs[1],
        max_new_tokens=24,
        num_frames=6,
        return_stats=True,
    )
    video = load_video(media["video"], num_frames=6)
    assert text == expected_text(pair_dirs, "Describe the video in detail.", videos=[video])
    assert stats.new_tokens > 0 and stats.draft_prefill_tokens < stats.target_prefill_tokens


def test_generate_answers_a_text_only_prompt(pair_dirs):
    text = vlmspec.generate("What is shown here?", model=pair_dirs[0], draft=pair_dirs[1], max_new_tokens=24)
    assert text == expected_text(pair_dirs, "What is shown here?")


def test_a_list_of_prompts_gives_a_list_of_texts(pair_dirs, media):
    texts = vlmspec.generate(
        ["Describe the image in detail.", "What is shown here?"],
        images=media["image"],
        model=pair_dirs[0],
        draft=pair_dirs[1],
        max_new_tokens=12,
    )
    image = load_image(media["image"])
    assert texts == [
        expected_text(pair_dirs, "Describe the image in detail.", images=[image], max_new_tokens=12),
        expected_text(pair_dirs, "What is shown here?", images=[image], max_new_tokens=12),
    ]


def test_the_pair_is_loaded_once_per_process(pair_dirs):
    first = vlmspec.load_pair(*pair_dirs)
    assert vlmspec.load_pair(*pair_dirs, torch_dtype=None) is first


def test_a_context_longer_than_the_model_is_refused(pair_dirs):
    with pytest.raises(ContextTooLongError, match="4096"):
        vlmspec.generate("What is shown here?", model=pair_dirs[0], draft=pair_dirs[1], max_new_tokens=5000)


def test_a_draft_with_another_vocabulary_is_refused(pair_dirs, tmp_path):
    FAMILIES["qwen2_5_vl"].drafts["noisy"].save_pretrained(tmp_path)
    build_tokenizer(vocab_size=300).save_pretrained(tmp_path)
    with pytest.raises(VocabularyMismatchError, match="tokenizers"):
        vlmspec.generate("What is shown here?", model=pair_dirs[0], draft=str(tmp_path))


def test_no_model_names_the_arguments_to_pass(monkeypatch):
    monkeypatch.setattr(vlmspec.api, "demo_pair", lambda: None)
    with pytest.raises(ValueError, match="model=.*draft="):
        vlmspec.generate("What is shown here?")


def test_generate_matches_the_wrapper_on_the_same_inputs(pair_dirs, media):
    spec = vlmspec.load_pair(*pair_dirs)
    wrapped = SpeculativeVLM(spec.target, spec.draft, "static-tree", processor=spec.processor)
    image = load_image(media["image"])
    inputs = spec.processor(spec.processor.apply_chat_template(chat_messages("Describe.", 1)), images=[image])
    ids = wrapped.generate(**inputs, max_new_tokens=16)
    text = vlmspec.generate(
        "Describe.", images=image, model=pair_dirs[0], draft=pair_dirs[1], max_new_tokens=16, policy="static-tree"
    )
    assert text == spec.processor.tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert torch.is_tensor(ids)


def test_a_list_of_prompts_decoded_three_at_a_time_gives_each_prompts_own_text(pair_dirs, media):
    """Five prompts of different lengths and media (an image, a video, none), in batches of three."""
    prompts = ["Describe the image in detail.", "What happens?", "What is shown here?", "Describe.", "Colours?"]
    images = [media["image"], None, None, media["image"], None]
    videos = [None, media["video"], None, None, media["video"]]
    kwargs = dict(model=pair_dirs[0], draft=pair_dirs[1], max_new_tokens=12, num_frames=4)
    texts, stats = vlmspec.generate(prompts, images=images, videos=videos, batch_size=3, return_stats=True, **kwargs)
    alone = [vlmspec.generate(p, images=i, videos=v, **kwargs) for p, i, v in zip(prompts, images, videos, strict=True)]
    assert texts == alone
    assert len(stats) == 5 and all(s.new_tokens > 0 for s in stats)


def test_a_bad_medium_in_a_list_of_prompts_fails_naming_it_before_any_decoding(pair_dirs, media, tmp_path, monkeypatch):
    decoded = []
    stream = SpeculativeVLM.stream
    monkeypatch.setattr(SpeculativeVLM, "stream", lambda self, *a, **k: decoded.append(1) or stream(self, *a, **k))
    images = [media["image"], str(tmp_path / "missing.png")]
    with pytest.raises(vlmspec.MediaNotFoundError, match="missing.png"):
        vlmspec.generate(["Describe.", "Describe."], images=images, model=pair_dirs[0], draft=pair_dirs[1])
    assert not decoded


def test_generate_stops_at_a_stop_string_with_the_pairs_own_tokenizer(pair_dirs, media):
    spec = vlmspec.load_pair(*pair_dirs)
    tokenizer = spec.processor.tokenizer
    image = load_image(media["image"])
    inputs = spec.processor(spec.processor.apply_chat_template(chat_messages("Describe.", 1)), images=[image])
    full = spec.target.generate(**inputs, do_sample=False, max_new_tokens=24)[0, inputs["input_ids"].shape[1] :]
    stop = next(t for t in (tokenizer.decode([int(i)]) for i in full[6:]) if t.strip().isalnum())
    ids = spec.target.generate(**inputs, do_sample=False, max_new_tokens=24, stop_strings=[stop], tokenizer=tokenizer)
    expected = tokenizer.decode(ids[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    text = vlmspec.generate(
        "Describe.", images=image, model=pair_dirs[0], draft=pair_dirs[1], max_new_tokens=24, stop_strings=[stop]
    )
    assert text == expected and text.endswith(stop)
