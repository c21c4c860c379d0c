"""Default frame sampling follows each family's own rule; a user's `num_frames` or `fps` is honoured.

Qwen families: qwen-vl-utils' `smart_nframes` (2 frames a second, at least 4, an even count, at most 768 and never
more than the clip has; indices spread evenly from the first to the last frame). LLaVA-OneVision: `transformers`'
video-processor sampler (every frame unless a count or rate is set; `i * total // n`).
"""

from __future__ import annotations

import numpy as np
import pytest
from media_files import write_video
from transformers.utils import is_torchvision_available

from vlmspec.processors import EvenSampling, QwenSampling, UniformSampling, load_video, sample_indices

QWEN, LLAVA = QwenSampling(), UniformSampling()


def indices(rule, total, native_fps, num_frames=None, fps=None, max_frames=None) -> list[int]:
    return sample_indices(total, native_fps, num_frames, fps, max_frames, sampling=rule).tolist()


@pytest.mark.parametrize(
    ("seconds", "native_fps", "count"),
    [(0.1, 30, 2), (1, 30, 4), (2.5, 2, 4), (7.28, 25, 14), (10, 30, 20), (33.4, 29.97, 66), (500, 30, 768)],
)
def test_qwen_default_takes_two_frames_a_second_within_its_bounds(seconds, native_fps, count):
    total = round(seconds * native_fps)
    taken = indices(QWEN, total, native_fps)
    assert len(taken) == count
    assert taken[0] == 0 and taken[-1] == total - 1
    assert np.abs(np.diff(taken) - (total - 1) / (count - 1)).max() <= 1


def test_qwen_default_indices_round_an_even_spread():
    assert indices(QWEN, 30, 30.0) == [0, 10, 19, 29]
    assert indices(QWEN, 3, 30.0) == [0, 2]
    assert indices(QWEN, 1, 30.0) == [0]


def test_qwen_rounds_a_given_frame_count_to_an_even_one():
    assert len(indices(QWEN, 300, 30.0, num_frames=7)) == 8
    assert len(indices(QWEN, 300, 30.0, num_frames=6)) == 6
    assert len(indices(QWEN, 300, 30.0, num_frames=5)) == 4  # halves round to even, as Python's round does
    assert len(indices(QWEN, 3, 30.0, num_frames=8)) == 2


def test_qwen_honours_a_given_rate_and_cap():
    assert len(indices(QWEN, 300, 30.0, fps=1.0)) == 10
    assert len(indices(QWEN, 300, 30.0, fps=0.1)) == 4
    assert len(indices(QWEN, 300, 30.0, max_frames=6)) == 6


def test_llava_onevision_default_takes_every_frame():
    assert indices(LLAVA, 30, 10.0) == list(range(30))


def test_llava_onevision_honours_a_count_or_rate_the_users_first():
    assert indices(LLAVA, 30, 10.0, num_frames=8) == [0, 3, 7, 11, 15, 18, 22, 26]
    assert indices(LLAVA, 30, 10.0, fps=2.0) == [0, 5, 10, 15, 20, 25]
    assert indices(UniformSampling(num_frames=8), 30, 10.0) == [0, 3, 7, 11, 15, 18, 22, 26]
    assert indices(UniformSampling(num_frames=8), 30, 10.0, fps=1.0) == [0, 10, 20]
    assert indices(LLAVA, 30, 10.0, max_frames=4) == [0, 7, 15, 22]
    assert indices(LLAVA, 5, 10.0, num_frames=8) == [0, 1, 2, 3, 4]


def test_without_a_family_two_frames_a_second_up_to_64():
    assert indices(EvenSampling(), 300, 30.0) == list(range(0, 300, 15))
    assert len(indices(EvenSampling(), 3000, 30.0)) == 64


def test_each_familys_processor_carries_its_rule(family):
    expected = UniformSampling() if family.name == "llava_onevision" else QwenSampling()
    assert family.processor.frame_sampling == expected


def test_a_decoded_clip_carries_its_span_and_indices_as_metadata(tmp_path):
    path = write_video(tmp_path / "clip.mp4", num_frames=30)
    video = load_video(path, sampling=QWEN)
    assert video.indices.tolist() == [0, 6, 12, 17, 23, 29]
    metadata = video.metadata
    assert (metadata.total_num_frames, metadata.fps, metadata.frames_indices) == (30, 10.0, video.indices.tolist())
    assert metadata.sampled_fps == pytest.approx(2.0)
    segment = load_video(path, start=1.0, end=2.0, sampling=QWEN)
    assert segment.total_frames == 10 and segment.indices.tolist() == [10, 13, 16, 19]


@pytest.mark.skipif(not is_torchvision_available(), reason="transformers' video processors need it")
@pytest.mark.parametrize("seconds", [0.5, 1, 3, 10, 41.7])
@pytest.mark.parametrize("request_", [{}, {"num_frames": 8}, {"fps": 1.0}])
def test_llava_onevision_rule_is_its_video_processors_sampler(seconds, request_):
    from transformers import LlavaOnevisionVideoProcessor
    from transformers.video_utils import VideoMetadata

    total = round(seconds * 24)
    expected = LlavaOnevisionVideoProcessor().sample_frames(VideoMetadata(total, fps=24.0), **request_)
    assert indices(LLAVA, total, 24.0, **request_) == np.asarray(expected).tolist()
