"""Video packers reproduce `transformers` 5.23's video processors: recorded outputs anywhere, live with torchvision.

Pixels may differ only by the resize kernel: at most one uint8 level after normalisation. (Measured: identical, as
both call torch's antialiased bicubic kernel on uint8 frames.)
"""

from __future__ import annotations

import json
from dataclasses import fields
from functools import cache

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from transformers.utils import is_torchvision_available
from video_cases import CASES, CONFIGS, RECORDINGS, Case, packed_processor, real_processor, run, summary

from vlmspec.demo_models import DEMO_DIR
from vlmspec.eval.demo_pair import build_demo_processor
from vlmspec.processors import Video, video_config, video_packer_for
from vlmspec.processors.video_config import video_settings

RECORDED = {record["name"]: record for record in json.loads(RECORDINGS.read_text())["cases"]}
#: Cases also run through live `transformers` (the 32-frame 720p clip, slow to run twice, only through its recording).
LIVE_CASES = [case for case in CASES if case.size != (720, 1280)]
needs_torchvision = pytest.mark.skipif(not is_torchvision_available(), reason="transformers' video processors need it")


def one_level(config: dict) -> float:
    """One uint8 step of a pixel, after rescaling and normalising with the config's std."""
    return 1 / 255 / min(config["image_std"])


def as_json(value):
    """`value` as it reads back from JSON (tuples become lists), for comparing settings."""
    return json.loads(json.dumps(value))


def case_of(record: dict) -> Case:
    return Case(**{f.name: record[f.name] for f in fields(Case)} | {"size": tuple(record["size"])})


@cache
def packed(name: str) -> dict:
    record = RECORDED[name]
    processor = packed_processor(record["family"], record["config"])
    return summary(run(processor, case_of(record)), processor.tokenizer)


def test_recordings_cover_every_case_and_stay_small():
    assert set(RECORDED) == {case.name for case in CASES}
    assert RECORDINGS.stat().st_size < 200_000


@pytest.mark.parametrize("name", list(RECORDED))
def test_grids_prompt_and_timing_equal_the_recorded_processor(name):
    record, ours = RECORDED[name], packed(name)
    for key in ("video_grid_thw", "second_per_grid_ts", "prompt", "input_ids"):
        assert ours.get(key) == record.get(key), key


@pytest.mark.parametrize("name", list(RECORDED))
def test_pixels_equal_the_recorded_processor_within_one_level(name):
    record, ours = RECORDED[name], packed(name)
    level = one_level(record["config"])
    assert ours["pixels"]["shape"] == record["pixels"]["shape"]
    assert ours["pixels"]["positions"] == record["pixels"]["positions"]
    assert np.abs(np.subtract(ours["pixels"]["values"], record["pixels"]["values"])).max() <= level
    count = np.prod(record["pixels"]["shape"])
    assert abs(ours["pixels"]["sum"] - record["pixels"]["sum"]) <= level * count * 1e-3
    assert abs(ours["pixels"]["norm"] - record["pixels"]["norm"]) <= level * np.sqrt(count * 1e-3)


def test_qwen2_5_vl_seconds_per_grid_come_from_the_clips_metadata():
    packer = packed_processor("qwen2_5_vl", CONFIGS["qwen2_5_vl"]).video_packer
    frames = np.zeros((20, 56, 84, 3), np.uint8)
    default = Video(frames, np.linspace(0, 299, 20).round(), 30.0, total_frames=300)
    eight = Video(frames[:8], np.linspace(0, 299, 8).round(), 30.0, total_frames=300)
    assert packer(default)[0]["second_per_grid_ts"].tolist() == [1.0]
    assert packer(eight)[0]["second_per_grid_ts"].tolist() == [2.5]


def test_qwen3_vl_spends_one_pixel_budget_on_all_frames_of_a_clip():
    patcher = packed_processor("qwen3_vl", CONFIGS["qwen3_vl"]).video_packer.patcher
    tokens = {n: n // 2 * np.prod(patcher.frame_size(n, 720, 1280, clip_budget=True)) // 32**2 for n in (8, 80)}
    assert tokens[80] == 11_960
    assert tokens[8] == 4 * 22 * 40


def test_qwen3_vl_frame_blocks_sit_inside_the_templates_vision_start_and_end():
    prompt = RECORDED["qwen3_vl-333x517-5at2-all"]["prompt"]
    block = "<|vision_start|><|video_pad|>*160<|vision_end|>"
    assert f"<|vision_start|><0.2 seconds>{block}<1.2 seconds>{block}<2.0 seconds><|vision_start|>" in prompt
    assert prompt.count("<|vision_start|>") == 4


def test_a_saved_packer_config_rebuilds_the_same_packer(tmp_path):
    for family, config in CONFIGS.items():
        processor = packed_processor(family, config)
        processor.save_pretrained(tmp_path / family)
        loaded = video_packer_for(processor.processor, video_config(str(tmp_path / family)))
        assert loaded.video_processor_config() == processor.video_packer.video_processor_config()
        assert loaded.sampling == processor.video_packer.sampling


def test_the_demo_pair_ships_the_video_config_its_processor_saves():
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DIR / "target")
    expected = {
        **build_demo_processor(tokenizer).video_packer.video_processor_config(),
        "processor_class": "Qwen2_5_VLProcessor",
    }
    for name in ("target", "draft"):
        assert json.loads((DEMO_DIR / name / "video_preprocessor_config.json").read_text()) == expected


@needs_torchvision
@pytest.mark.parametrize("case", LIVE_CASES, ids=lambda c: c.name)
def test_packers_equal_live_transformers(case):
    config = CONFIGS[case.family]
    ours, theirs = run(packed_processor(case.family, config), case), run(real_processor(case.family, config), case)
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key == "pixel_values_videos":
            assert (ours[key] - theirs[key]).abs().max() <= one_level(config)
        else:
            assert torch.equal(ours[key], theirs[key]), key


@needs_torchvision
def test_a_saved_packer_config_loads_as_the_familys_video_processor(tmp_path):
    from transformers import AutoVideoProcessor

    for family, config in CONFIGS.items():
        packed_processor(family, config).save_pretrained(tmp_path / family)
        video_processor = AutoVideoProcessor.from_pretrained(tmp_path / family)
        assert type(video_processor).__name__ == config["video_processor_type"]
        _, settings = video_settings(type(packed_processor(family, config).processor).__name__, config)
        for key in ("size", "image_mean", "image_std", "patch_size", "merge_size", "temporal_patch_size"):
            if key in settings:
                assert as_json(video_processor.to_dict()[key]) == as_json(settings[key]), (family, key)


@needs_torchvision
@pytest.mark.parametrize("kind", ["Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor", "LlavaOnevisionVideoProcessor"])
def test_defaults_are_the_video_processor_classes_own(kind):
    import transformers

    defaults = getattr(transformers, kind)().to_dict()
    _, ours = video_settings("", {"video_processor_type": kind})
    for key, value in ours.items():
        assert as_json(value) == as_json(defaults.get(key)), key


@needs_torchvision
def test_a_real_processor_samples_frames_by_its_familys_rule():
    for family, config in CONFIGS.items():
        assert real_processor(family, config).frame_sampling == packed_processor(family, config).frame_sampling


def test_a_familys_video_processing_comes_from_its_adapter():
    from vlmspec.adapters import VideoProcessing, register_adapter, unregister_adapter
    from vlmspec.adapters.llava_onevision import LlavaOnevisionAdapter
    from vlmspec.processors import UniformSampling
    from vlmspec.processors.video_config import family_for, frame_sampling_for

    class NewFamilyAdapter(LlavaOnevisionAdapter):
        model_classes = ("NewFamilyForConditionalGeneration",)
        video_processing = VideoProcessing(
            processor_classes=("NewFamilyProcessor",),
            video_processor="NewFamilyVideoProcessor",
            defaults=dict(size={"height": 224, "width": 224}, image_mean=(0.5,) * 3, image_std=(0.5,) * 3),
            packing="pooled-frames",
            sampling="uniform",
        )

    register_adapter(NewFamilyAdapter)
    try:
        assert family_for("NewFamilyProcessor", {}) is NewFamilyAdapter.video_processing
        assert family_for("", {"video_processor_type": "NewFamilyVideoProcessor"}) is NewFamilyAdapter.video_processing
        assert isinstance(frame_sampling_for("NewFamilyProcessor", {"num_frames": 6}), UniformSampling)
        _, settings = video_settings("NewFamilyProcessor", {"num_frames": 6})
        assert settings["size"] == {"height": 224, "width": 224} and settings["num_frames"] == 6
    finally:
        unregister_adapter(NewFamilyAdapter)
    assert family_for("NewFamilyProcessor", {}) is None
