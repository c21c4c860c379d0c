"""Peak memory of admitting one long video prompt with the demo pair on the CPU: `generate` over the prompt with two
new tokens (so its row is admitted and decodes), reporting the most bytes of KV cache slabs (the 5-D tensors the
caches allocate) alive at once, and the rise of the process's resident-memory high-water mark over the call.

Usage: python scripts/admission_memory.py [--frames 288] [--size 112]
"""

from __future__ import annotations

import argparse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from vlmspec.api import load_pair
from vlmspec.testing.common import chat_inputs, sample_frames


class SlabBytes:
    """Bytes of the 5-D tensors made by `torch.zeros` and `Tensor.new_zeros` that are alive, and their peak."""

    def __init__(self):
        self.alive = 0
        self.peak = 0

    def made(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.ndim == 5:
            size = tensor.numel() * tensor.element_size()
            self.alive += size
            self.peak = max(self.peak, self.alive)
            weakref.finalize(tensor, self.freed, size)
        return tensor

    def freed(self, size: int) -> None:
        self.alive -= size


@contextmanager
def counting(slabs: SlabBytes) -> Iterator[None]:
    """Count the slabs made inside."""
    zeros, new_zeros = torch.zeros, torch.Tensor.new_zeros

    def wrap(make: Callable) -> Callable:
        return lambda *args, **kwargs: slabs.made(make(*args, **kwargs))

    torch.zeros, torch.Tensor.new_zeros = wrap(zeros), wrap(new_zeros)
    try:
        yield
    finally:
        torch.zeros, torch.Tensor.new_zeros = zeros, new_zeros


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=288)
    parser.add_argument("--size", type=int, default=112)
    args = parser.parse_args()
    spec = load_pair(compile="off")
    video = sample_frames(0, num_frames=args.frames, size=(args.size, args.size))
    inputs = chat_inputs(spec.processor, "Describe the video.", video=video)
    slabs = SlabBytes()
    with torch.inference_mode():
        spec.generate(**inputs, max_new_tokens=2, do_sample=False)
        Path("/proc/self/clear_refs").write_text("5")
        resident = status_kib("VmRSS")
        with counting(slabs):
            spec.generate(**inputs, max_new_tokens=2, do_sample=False)
        high = status_kib("VmHWM")
    print(f"prompt tokens: {inputs['input_ids'].shape[1]}")
    print(f"peak KV slab bytes alive: {slabs.peak / 2**20:.2f} MiB")
    print(f"resident memory high-water mark over the call: +{(high - resident) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
