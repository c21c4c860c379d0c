"""Media in: images and videos from real files, frame sampling, prompts, and clear errors for bad input."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from media_files import write_empty_video, write_image, write_video
from PIL import Image

from vlmspec import (
    EmptyPromptError,
    MediaNotFoundError,
    NoFramesError,
    NotAnImageError,
    PlaceholderMismatchError,
    UnreadableVideoError,
    UnsupportedMediaError,
)
from vlmspec.processors import chat_messages, load_image, load_video, load_videos, sample_indices


@pytest.mark.parametrize("extension", ["png", "jpg", "webp"])
def test_images_load_from_real_files(tmp_path, extension):
    path = write_image(tmp_path / f"picture.{extension}")
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (80, 60)
    if extension == "png":
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(path).convert("RGB")))


def test_images_load_from_arrays_tensors_and_pil():
    array = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(load_image(array)), array)
    assert np.array_equal(np.asarray(load_image(torch.from_numpy(array).permute(2, 0, 1))), array)
    assert np.array_equal(np.asarray(load_image(array / 255.0)), array)
    assert load_image(Image.fromarray(array).convert("RGBA")).mode == "RGB"


def test_sampling_num_frames_spreads_evenly():
    assert sample_indices(30, 10.0, num_frames=4).tolist() == [0, 10, 19, 29]


def test_sampling_by_fps_takes_one_frame_per_interval():
    assert sample_indices(30, 10.0, fps=2.0).tolist() == [0, 5, 10, 15, 20, 25]


def test_sampling_by_fps_is_capped_by_max_frames():
    assert sample_indices(30, 10.0, fps=5.0, max_frames=3).tolist() == [0, 14, 29]


def test_sampling_between_start_and_end_seconds():
    assert sample_indices(30, 10.0, num_frames=4, start=1.0, end=2.0).tolist() == [10, 13, 16, 19]
    assert sample_indices(30, 10.0, fps=10.0, start=2.5).tolist() == list(range(25, 30))


def test_sampling_refuses_both_num_frames_and_fps():
    with pytest.raises(ValueError, match="exclusive"):
        sample_indices(30, 10.0, num_frames=4, fps=1.0)


def test_videos_decode_the_sampled_frames_from_a_real_file(tmp_path):
    path = write_video(tmp_path / "clip.mp4")
    video = load_video(path, num_frames=4)
    assert video.frames.shape == (4, 48, 64, 3)
    assert video.indices.tolist() == [0, 10, 19, 29]
    assert video.fps == pytest.approx(10.0)
    levels = video.frames.reshape(4, -1).mean(axis=1)
    assert np.allclose(levels, 8 * video.indices, atol=4)
    assert video.timestamps.tolist() == pytest.approx([0.0, 1.0, 1.9, 2.9])


def test_videos_come_from_arrays_and_frame_lists():
    frames = np.zeros((5, 8, 8, 3), np.uint8)
    assert load_video(frames, source_fps=5.0).sample_fps == 5.0
    assert load_video([Image.fromarray(f) for f in frames]).frames.shape == (5, 8, 8, 3)
    assert len(load_videos([frames, frames])) == 2
    assert len(load_videos(list(frames))) == 1


def test_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere.jpg"
    with pytest.raises(MediaNotFoundError, match="nowhere.jpg"):
        load_image(path)
    with pytest.raises(MediaNotFoundError, match="nowhere.mp4"):
        load_video(tmp_path / "nowhere.mp4")


def test_random_bytes_named_jpg_are_not_an_image(tmp_path):
    path = tmp_path / "noise.jpg"
    path.write_bytes(os.urandom(2048))
    with pytest.raises(NotAnImageError, match="noise.jpg"):
        load_image(path)


def test_an_mp4_cut_in_half_is_unreadable(tmp_path):
    whole = write_video(tmp_path / "whole.mp4").read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UnreadableVideoError, match="cut.mp4"):
        load_video(cut)


def test_a_zero_frame_video_has_no_frames(tmp_path):
    with pytest.raises(NoFramesError, match="empty.mp4"):
        load_video(write_empty_video(tmp_path / "empty.mp4"))


def test_a_range_past_the_end_selects_no_frames(tmp_path):
    path = write_video(tmp_path / "short.mp4", num_frames=10)
    with pytest.raises(NoFramesError, match="short.mp4"):
        load_video(path, start=5.0)


def test_an_unsupported_extension_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(UnsupportedMediaError, match="notes.txt"):
        load_image(path)
    with pytest.raises(UnsupportedMediaError, match="notes.txt"):
        load_video(path)


def test_an_empty_prompt_is_refused():
    with pytest.raises(EmptyPromptError):
        chat_messages("   ", num_images=1)


def test_more_images_than_placeholders_is_refused():
    with pytest.raises(PlaceholderMismatchError, match="2 images"):
        chat_messages("Compare <image> with the other one.", num_images=2)


def test_placeholders_put_media_where_the_prompt_says():
    content = chat_messages("First <image> then <video> and done.", num_images=1, num_videos=1)[0]["content"]
    assert [c["type"] for c in content] == ["text", "image", "text", "video", "text"]
    content = chat_messages("Describe.", num_images=2, num_videos=1)[0]["content"]
    assert [c["type"] for c in content] == ["image", "image", "video", "text"]


def test_each_family_prompt_holds_its_visual_placeholders(family, tmp_path):
    processor = family.processor
    video = load_video(write_video(tmp_path / "clip.mp4", size=(64, 64)), num_frames=4)
    image = load_image(write_image(tmp_path / "pic.png"))
    text = processor.apply_chat_template(chat_messages("Describe <image> and <video>.", 1, 1))
    inputs = processor(text, images=[image], videos=[video])
    ids = inputs["input_ids"][0]
    config = family.target.config
    decoded = processor.tokenizer.decode(ids)
    if "image_grid_thw" in inputs:
        merge = config.vision_config.spatial_merge_size**2
        assert int((ids == config.image_token_id).sum()) == int(inputs["image_grid_thw"].prod()) // merge
        assert int((ids == config.video_token_id).sum()) == int(inputs["video_grid_thw"].prod()) // merge
    else:
        assert int((ids == config.image_token_id).sum()) > 0
        assert int((ids == config.video_token_id).sum()) == 4 * 4 + 1
    if family.name.startswith("qwen3"):
        assert "<|vision_start|><0.5 seconds><|vision_start|>" in decoded and "<2.4 seconds>" in decoded
        assert "<|vision_end|><|vision_end|>" in decoded
    if family.name == "qwen2_5_vl":
        assert inputs["second_per_grid_ts"].tolist() == pytest.approx([2 / (4 / 30 * 10)])
    assert decoded.index("Describe") < decoded.index("and")
