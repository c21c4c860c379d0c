"""Rotary positions of a draft head, as its target places tokens: 1-D RoPE, or M-RoPE (three axes: time, height,
width) for Qwen targets, in sections (Qwen2.5-VL) or interleaved (Qwen3-VL)."""

from __future__ import annotations

import torch


def axis_of_frequencies(half: int, mrope_section: list[int] | None, interleaved: bool) -> torch.Tensor | None:
    """Which position axis (0 time, 1 height, 2 width) rotates each of the `half` = head_dim / 2 frequencies: in
    sections, the first `mrope_section[0]` frequencies time, the next height, the rest width (Qwen2.5-VL); interleaved,
    frequency i height where i % 3 == 1 within 3 x the height section, width where i % 3 == 2 within 3 x the width
    section, time elsewhere (Qwen3-VL). None for 1-D RoPE."""
    if mrope_section is None:
        return None
    if sum(mrope_section) != half:
        raise ValueError(f"mrope_section {mrope_section} sums to {sum(mrope_section)}, not head_dim / 2 = {half}")
    index = torch.arange(half)
    if interleaved:
        axis = torch.zeros(half, dtype=torch.long)
        axis[(index % 3 == 1) & (index < 3 * mrope_section[1])] = 1
        axis[(index % 3 == 2) & (index < 3 * mrope_section[2])] = 2
        return axis
    bounds = torch.tensor([mrope_section[0], mrope_section[0] + mrope_section[1]])
    return torch.bucketize(index, bounds, right=True)


class HeadRotary(torch.nn.Module):
    """cos and sin `(B, q, head_dim)` of `position_ids`: `(B, q)` for 1-D RoPE or `(3, B, q)` for M-RoPE (a 1-D
    position on all three axes for text)."""

    def __init__(self, head_dim: int, theta: float, mrope_section: list[int] | None, interleaved: bool):
        super().__init__()
        half = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / head_dim))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        axis = axis_of_frequencies(half, mrope_section, interleaved)
        self.register_buffer("axis", axis, persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = position_ids.float()
        if self.axis is None:
            if positions.ndim == 3:
                positions = positions[0]
            freqs = positions[..., None] * self.inv_freq
        else:
            if positions.ndim == 2:
                positions = positions[None].expand(3, -1, -1)
            per_axis = positions[..., None] * self.inv_freq  # (3, B, q, half)
            index = self.axis.view(1, 1, 1, -1).expand(1, *per_axis.shape[1:])
            freqs = per_axis.gather(0, index)[0]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`x` `(B, heads, q, D)` rotated by `cos`, `sin` `(B, q, D)` (the rotate-half convention of Llama and Qwen)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]
