"""0, 1, 2, ... on a device, made once and sliced: a step asks for several such ranges, and slicing one costs no
kernel launch where `torch.arange` costs one each time."""

from __future__ import annotations

import torch

_RANGES: dict[torch.device, torch.Tensor] = {}


def arange(n: int, device: torch.device) -> torch.Tensor:
    """`torch.arange(n)` (int64) on `device`, as a view of one kept range (never write into it)."""
    device = torch.device(device)
    held = _RANGES.get(device)
    if held is None or held.shape[0] < n:
        held = _RANGES[device] = torch.arange(max(n, 2 * (0 if held is None else held.shape[0]), 1024), device=device)
    return held[:n]
