"""Small integer tensors a step needs on its device, made without costing what a step cannot afford: 0, 1, 2, ...
made once and sliced (slicing costs no kernel launch where `torch.arange` costs one each time), and values the host
knows (row lengths, counts) copied without waiting for the device."""

from __future__ import annotations

from collections.abc import Sequence

import torch

_RANGES: dict[torch.device, torch.Tensor] = {}
_ZEROS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
_FILLED: dict[tuple[torch.device, int], torch.Tensor] = {}
_TRUES: dict[torch.device, torch.Tensor] = {}


def arange(n: int, device: torch.device) -> torch.Tensor:
    """`torch.arange(n)` (int64) on `device`, as a view of one kept range (never write into it)."""
    device = torch.device(device)
    held = _RANGES.get(device)
    if held is None or held.shape[0] < n:
        held = _RANGES[device] = torch.arange(max(n, 2 * (0 if held is None else held.shape[0]), 1024), device=device)
    return held[:n]


def zeros(n: int, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`torch.zeros(n, dtype=dtype)` on `device`, as a view of one kept tensor (never write into it)."""
    key = (torch.device(device), dtype)
    held = _ZEROS.get(key)
    if held is None or held.shape[0] < n:
        size = max(n, 2 * (0 if held is None else held.shape[0]), 64)
        held = _ZEROS[key] = torch.zeros(size, dtype=dtype, device=key[0])
    return held[:n]


def filled(value: int, n: int, device: torch.device) -> torch.Tensor:
    """`torch.full((n,), value)` (int64) on `device`, as a contiguous view of one kept tensor per value (never write
    into it): one draft level's depths, at no launch and with the strides a compiled forward's graph expects."""
    key = (torch.device(device), value)
    held = _FILLED.get(key)
    if held is None or held.shape[0] < n:
        size = max(n, 2 * (0 if held is None else held.shape[0]), 128)
        held = _FILLED[key] = torch.full((size,), value, device=key[0])
    return held[:n]


def trues(rows: int, n: int, device: torch.device) -> torch.Tensor:
    """An all-True (rows, n) bool tensor on `device`, as a contiguous view of one kept tensor (never write into it)."""
    key = torch.device(device)
    held = _TRUES.get(key)
    if held is None or held.shape[0] < rows * n:
        size = max(rows * n, 2 * (0 if held is None else held.shape[0]), 1024)
        held = _TRUES[key] = torch.ones(size, dtype=torch.bool, device=key)
    return held[: rows * n].view(rows, n)


def host_values(values: Sequence[float], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (host numbers) as a `dtype` tensor on `device`. On CUDA the copy starts from pinned memory without
    blocking: `torch.tensor(values, device=...)` waits for every queued kernel first (a pipeline drain, as costly as a
    read), while this one is ordered after them in the stream and the host goes on."""
    return host_tensor(torch.tensor(values, dtype=dtype), device)


def host_tensor(held: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`held` (a tensor the host made) on `device`, copied as `host_values` copies (no wait for the device)."""
    device = torch.device(device)
    if device.type != "cuda":
        return held.to(device)
    return held.pin_memory().to(device, non_blocking=True)
