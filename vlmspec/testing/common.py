"""Family-independent fixture helpers: noisy copies, deterministic media, chat-formatted inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from ..processors import VisualInputs, chat_messages


def sharpen(model: torch.nn.Module, logit_scale: float) -> torch.nn.Module:
    """Scale the output head so next-token distributions are peaked, as a trained model's are.

    With flat random distributions an entropy-adaptive policy has nothing to adapt to.
    """
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(logit_scale)
    return model.eval()


def noisy_copy(model: torch.nn.Module, scale: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """A copy of `model` with Gaussian noise added to every weight: a draft that agrees often, not always."""
    device = next(model.parameters()).device
    clone = type(model)(model.config).to(device).eval()
    clone.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clone.parameters():
            noise = torch.randn(p.shape, generator=generator).to(p.device)
            p.add_(noise * scale * (p.std() if p.numel() > 1 else 1.0))
    clone.generation_config = model.generation_config
    return clone


def sample_image(seed: int = 0, size: tuple[int, int] = (96, 128)) -> Image.Image:
    """A deterministic random RGB image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def sample_frames(seed: int = 0, num_frames: int = 4, size: tuple[int, int] = (56, 84)) -> np.ndarray:
    """Deterministic random video frames `(T, H, W, 3)` uint8."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (num_frames, *size, 3), dtype=np.uint8)


def chat_inputs(
    processor: VisualInputs,
    prompt: str,
    images: list[Image.Image] | None = None,
    video: np.ndarray | None = None,
    video_fps: float = 2.0,
) -> dict[str, Any]:
    """Model inputs for one user turn (images, then an optional video, then the prompt) with the chat template."""
    images = images or []
    videos = [] if video is None else [video]
    text = processor.apply_chat_template(chat_messages(prompt, len(images), len(videos)))
    return dict(processor(text, images=images, videos=videos, video_fps=video_fps))
