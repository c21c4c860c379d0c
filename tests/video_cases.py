"""Video cases shared by `scripts/record_video_processors.py` and the tests that replay its recordings.

Each case is a family with its released checkpoint's video processor settings, a frame size and a clip (length, frame
rate, requested frames); the frames are synthesised from the case alone, so a recording made where torchvision works
can be replayed anywhere.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlmspec.processors import QwenSampling, UniformSampling, Video, VisualInputs, chat_messages, image_only
from vlmspec.processors import video_packer_for as packer_for
from vlmspec.testing import build_tokenizer, released_files
from vlmspec.testing.llava_onevision import llava_tokenizer

RECORDINGS = Path(__file__).parent / "data" / "video_processors.json"


def _video_settings(processor_type: str, released: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """A video processor config of `processor_type` with the released file's `keys`."""
    return {"video_processor_type": processor_type, **{k: released[k] for k in keys}}


_QWEN_KEYS = ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")

#: The released checkpoints' video processor settings (Qwen2.5-VL has only `preprocessor_config.json`).
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2_5_vl": _video_settings(
        "Qwen2VLVideoProcessor", released_files.QWEN2_5_VL_PREPROCESSOR, ("min_pixels", "max_pixels", *_QWEN_KEYS)
    ),
    "qwen3_vl": _video_settings(
        "Qwen3VLVideoProcessor", released_files.QWEN3_VL_VIDEO_PREPROCESSOR, ("size", *_QWEN_KEYS)
    ),
    "llava_onevision": _video_settings(
        "LlavaOnevisionVideoProcessor", released_files.LLAVA_OV_VIDEO_PREPROCESSOR, ("size", "image_mean", "image_std")
    ),
}
#: LLaVA-OneVision-hf's processor: 384 / 14 -> 27 x 27 patches, the full feature map.
LLAVA_PROCESSOR = dict(num_image_tokens=729, vision_feature_select_strategy="full")


@dataclass(frozen=True)
class Case:
    """A clip of `total` frames at `fps` and `size` (height, width), sampled by the family's rule (`num_frames` if
    given); `decoded=False` means the frames were given directly, as an array of every frame.
    """

    family: str
    size: tuple[int, int]
    total: int
    fps: float
    num_frames: int | None = None
    decoded: bool = True

    @property
    def name(self) -> str:
        count = "all" if not self.decoded else self.num_frames or "default"
        return f"{self.family}-{self.size[0]}x{self.size[1]}-{self.total}at{self.fps:g}-{count}"


CASES = [
    Case("qwen2_5_vl", (56, 84), 300, 30.0),
    Case("qwen2_5_vl", (333, 517), 300, 30.0, num_frames=8),
    Case("qwen2_5_vl", (333, 517), 5, 2.0, decoded=False),
    Case("qwen2_5_vl", (1080, 1920), 100, 25.0, num_frames=2),
    Case("qwen3_vl", (56, 84), 300, 30.0),
    Case("qwen3_vl", (333, 517), 182, 25.0),
    Case("qwen3_vl", (333, 517), 5, 2.0, decoded=False),
    Case("qwen3_vl", (1080, 1920), 75, 30.0, num_frames=4),
    Case("qwen3_vl", (720, 1280), 480, 30.0),
    Case("llava_onevision", (56, 84), 30, 10.0),
    Case("llava_onevision", (333, 517), 300, 30.0, num_frames=8),
    Case("llava_onevision", (1080, 1920), 120, 24.0, num_frames=4),
]


def sampling(family: str) -> QwenSampling | UniformSampling:
    """The family's frame rule with the released settings (LLaVA-OneVision-hf sets no frame count or rate)."""
    return UniformSampling() if family == "llava_onevision" else QwenSampling()


def video(case: Case) -> Video:
    """The case's sampled frames: a gradient plus fixed noise, brightened (mod 256) with the frame index."""
    if case.decoded:
        indices = sampling(case.family)(case.total, case.fps, case.num_frames, None, None)
    else:
        indices = np.arange(case.total)
    height, width = case.size
    rows, cols = np.mgrid[0:height, 0:width]
    channels = np.array([3, 5, 7])
    gradient = (rows[..., None] * channels + cols[..., None] * channels[::-1] // 2) % 208
    noise = np.random.default_rng(height * 7919 + width).integers(0, 48, (height, width, 3))
    base = (gradient + noise).astype(np.uint8)
    frames = np.stack([base + np.uint8(9 * int(index) % 256) for index in indices])
    return Video(frames, indices, case.fps, total_frames=case.total)


def _parts(family: str):
    from transformers import LlavaOnevisionProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if family == "llava_onevision":
        tokenizer = llava_tokenizer()
        return LlavaOnevisionProcessor, LlavaOnevisionImageProcessorPil(), tokenizer, LLAVA_PROCESSOR
    processor_class = Qwen2_5_VLProcessor if family == "qwen2_5_vl" else Qwen3VLProcessor
    return processor_class, Qwen2VLImageProcessorPil(), build_tokenizer(), {}


def packed_processor(family: str, config: dict[str, Any]) -> VisualInputs:
    """The family's processor class without its video slot, plus the packer `config` sets up (no torchvision)."""
    processor_class, image_processor, tokenizer, extra = _parts(family)
    processor = image_only(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template, **extra
    )
    return VisualInputs(processor, packer_for(processor, dict(config)))


def real_processor(family: str, config: dict[str, Any]) -> VisualInputs:
    """The family's `transformers` processor with its real video processor set up by `config` (needs torchvision)."""
    import transformers

    processor_class, image_processor, tokenizer, extra = _parts(family)
    video_class = getattr(transformers, config["video_processor_type"])
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_class.from_dict(dict(config), cap_pixels_per_frame=False),
        chat_template=tokenizer.chat_template,
        **extra,
    )
    return VisualInputs(processor)


def run(processor: VisualInputs, case: Case) -> dict[str, Any]:
    """The processor's inputs for a one-video chat turn of the case."""
    text = processor.apply_chat_template(chat_messages("Describe the video.", 0, 1))
    return dict(processor(text, videos=[video(case)]))


def summary(inputs: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """What a recording keeps of a processor's output: grids, timing inputs, the prompt (runs of a token folded,
    ids hashed) and pixel statistics with a sample of values at fixed positions.
    """
    ids = inputs["input_ids"][0].tolist()
    pixels = inputs["pixel_values_videos"].flatten()
    positions = np.linspace(0, pixels.numel() - 1, 96).round().astype(np.int64)
    out = {
        "prompt": re.sub(
            r"((<[^<>]+>)\2+)", lambda m: f"{m.group(2)}*{len(m.group(1)) // len(m.group(2))}", tokenizer.decode(ids)
        ),
        "input_ids": {"length": len(ids), "sha256": hashlib.sha256(str(ids).encode()).hexdigest()},
        "pixels": {
            "shape": list(inputs["pixel_values_videos"].shape),
            "sum": float(pixels.sum(dtype=torch.float64)),
            "norm": float(torch.linalg.vector_norm(pixels, dtype=torch.float64)),
            "positions": positions.tolist(),
            "values": pixels[positions].tolist(),
        },
    }
    for key in ("video_grid_thw", "second_per_grid_ts"):
        if key in inputs:
            out[key] = inputs[key].tolist()
    return out
