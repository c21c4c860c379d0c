"""Compiled forwards: when `torch.compile` runs a model's decoding forward, and how it is set up.

Compiled, a decoding forward sees fixed shapes only: the cache is fixed (`SlabCache.fix`), the tokens are padded
(`padded_size`: 1, 2, 4, 8, 16, then multiples of 16) and the mask spans the cache's rounded capacity, so each model
compiles once per padded size and capacity. On CUDA the graphs are also captured (`mode="reduce-overhead"`): one replay
per forward instead of hundreds of launches. On the CPU inductor fuses the forward.

`"auto"` compiles on CUDA and runs eager elsewhere: on the CPU compiled decoding of the demo pair measured faster
in the steady state (0.27 s against 0.34 s a call of 64 tokens), but compiling every padded size takes 20-50 s,
which a one-off call or a short job never earns back (docs/benchmarks.md); on CUDA, where launches cost, the rule
awaits a measurement. Quantised (bitsandbytes) and offloaded models always run eager.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch.utils._triton import has_triton
from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

COMPILE_CHOICES = ("auto", "on", "off")
#: Overrides `compile="auto"` everywhere (`on` or `off`), e.g. to run a test suite compiled.
COMPILE_ENV = "VLMSPEC_COMPILE"

#: Where a model keeps its compiled form (in its `__dict__`, not as a submodule), so every wrapper of the model
#: shares its compiled graphs and they go when the model goes.
_ATTRIBUTE = "_vlmspec_compiled"
#: Graphs one forward may hold (padded sizes x cache capacities x models); torch's default of 8 would send
#: further shapes back to eager.
RECOMPILE_LIMIT = 64
_NOTICES: set[tuple[int, str]] = set()


def resolve_compile(setting: str | bool) -> str:
    """`True`/`False`/`"on"`/`"off"`/`"auto"` as one of `COMPILE_CHOICES`; `"auto"` takes `VLMSPEC_COMPILE`."""
    choice = {True: "on", False: "off"}.get(setting, setting) if isinstance(setting, bool) else setting
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile must be True, False or one of {', '.join(COMPILE_CHOICES)}, got {setting!r}")
    if choice == "auto":
        override = os.environ.get(COMPILE_ENV, "auto").strip().lower()
        if override not in COMPILE_CHOICES:
            raise ValueError(f"{COMPILE_ENV} must be one of {', '.join(COMPILE_CHOICES)}, got {override!r}")
        choice = override
    return choice


def _why_eager(model: PreTrainedModel) -> str | None:
    """Why `model` cannot be compiled, or None."""
    if getattr(model, "is_quantized", False) or getattr(model, "quantization_method", None) is not None:
        return "it is quantised, and such models cannot be compiled"
    devices = set(getattr(model, "hf_device_map", {}).values())
    if devices & {"cpu", "disk"} and len(devices) > 1:
        return "it is offloaded, and such models cannot be compiled"
    return None


def compiled_forward(model: PreTrainedModel, setting: str | bool, role: str) -> Callable | None:
    """The compiled module to run `model`'s decoding forwards through, or None to run them eager (with a one-line
    notice, once per model, when compiling was asked for or is the default and cannot be had)."""
    choice = resolve_compile(setting)
    device = model.get_input_embeddings().weight.device
    if choice == "off" or (choice == "auto" and device.type != "cuda"):
        return None
    why = _why_eager(model)
    if why is None and device.type == "cuda" and not has_triton():
        why = "torch.compile needs Triton on CUDA, and it is not installed"
    if why is not None:
        if (id(model), why) not in _NOTICES:
            _NOTICES.add((id(model), why))
            logger.warning("vlmspec: the %s runs eager: %s", role, why)
        return None
    held = model.__dict__.get(_ATTRIBUTE)
    if held is None or held.owner != id(model):
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        mode = "reduce-overhead" if device.type == "cuda" else None
        held = model.__dict__[_ATTRIBUTE] = _Held(torch.compile(model, dynamic=False, mode=mode), id(model))
    return held.module


class _Held:
    """A model's compiled form, kept in the model's `__dict__` and valid for that model only: copies and pickles
    of the model leave it behind or ignore it (a copy compiles its own), so it never runs another model's weights."""

    __slots__ = ("module", "owner")

    def __init__(self, module: Callable, owner: int):
        self.module = module
        self.owner = owner

    def __copy__(self) -> None:
        return None

    def __deepcopy__(self, memo: dict) -> None:
        return None

    def __reduce__(self) -> tuple:
        return type(None), ()


#: The most tokens a decoding forward feeds: a tree of 64 nodes and its root (the policies' node cap).
LARGEST_FORWARD = 65


def padded_sizes(largest: int) -> list[int]:
    """Every padded size a forward of 1 to `largest` tokens runs at."""
    return sorted({padded_size(count) for count in range(1, largest + 1)})


def padded_size(count: int) -> int:
    """The fixed size a compiled forward of `count` tokens runs at: the next power of two up to 16, then the next
    multiple of 16 (a 65-node SAGE tree runs at 80, not 128)."""
    if count <= 16:
        return 1 << max(0, count - 1).bit_length()
    return -(-count // 16) * 16


def fixed_mask(block: torch.Tensor, end: int, size: int, capacity: int) -> torch.Tensor:
    """The additive mask `(1, 1, size, capacity)` of a fixed-shape forward whose `q` real tokens end at cache
    position `end`: every row sees the positions before the `block` `(1, 1, q, k)`, which masks the last k real
    ones; padding rows see only the prefix, and nothing sees a padding row or a position at `end` or later."""
    q, width = block.shape[-2:]
    mask = torch.full((1, 1, size, capacity), torch.finfo(block.dtype).min, dtype=block.dtype, device=block.device)
    mask[..., : end - width] = 0
    mask[..., :q, end - width : end] = block
    return mask
