"""Counting a compiled step from a `torch.profiler` trace: compiled regions entered, operators run outside them, host
reads, and graphs compiled while counting.

A compiled step cannot be counted as an eager one is (`profile.LaunchCounter`): dynamo refuses to compile under a
Python dispatch mode and traces a function mode into its graphs, recompiling them. The profiler only observes:
- a *compiled region* is a `Torch-Compiled Region` event not inside another one (one entry into a compiled frame:
  on a GPU one graph replay under `mode="reduce-overhead"`, a few fused kernels elsewhere);
- an *operator outside* is an aten event inside no compiled region and no other aten event, views and bare
  allocations excluded: the eager work a GPU launches a kernel for;
- a *host read* is `aten::_local_scalar_dense` (`item`, `bool`, `int`, `float` and `index` of a tensor), a nonzero
  (`nonzero`, `argwhere`, indexing with a boolean mask), `masked_select`, `unique`, or a call of a tensor's
  `tolist`, `cpu` or `numpy`, wherever it runs (a read inside a compiled region is a graph break);
- *graphs compiled* is the growth of dynamo's `unique_graphs` counter while counting: after a warm-up, every one is
  a recompile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch._dynamo.utils import counters

T = TypeVar("T")
REGION = "Torch-Compiled Region"
_READ_OPERATORS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_dim"}
_READ_OPERATORS |= {"aten::_unique2", "aten::unique_consecutive", "aten::argwhere"}
_READ_METHODS = ("tolist", "cpu", "numpy")
_NO_KERNEL = {"empty", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach", "detach_", "alias"}


@dataclass
class TraceCounts:
    """What a traced block ran: compiled regions entered, operators outside them, host reads, graphs compiled."""

    regions: int = 0
    outside: int = 0
    reads: int = 0
    compiled: int = 0

    def __sub__(self, other: TraceCounts) -> TraceCounts:
        return TraceCounts(
            self.regions - other.regions,
            self.outside - other.outside,
            self.reads - other.reads,
            self.compiled - other.compiled,
        )


def traced(run: Callable[[], T], attempts: int = 3) -> tuple[TraceCounts, T]:
    """What `run()` runs (`TraceCounts`), and what it returns. A call that compiles graphs is run again for its
    counts (a trace taken while dynamo compiles cannot be read back: torch's parser meets names it cannot decode),
    and the graphs every attempt compiled are counted."""
    compiled = 0
    for _ in range(attempts):
        graphs = counters["stats"]["unique_graphs"]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as trace:
            result = run()
        grown = counters["stats"]["unique_graphs"] - graphs
        if not grown:
            counts = count_events(trace.events())
            counts.compiled = compiled
            return counts, result
        compiled += grown
    raise RuntimeError(f"graphs were still compiled on the call's attempt {attempts}: its trace cannot be read")


def count_events(events: list) -> TraceCounts:
    """The regions, operators outside them and host reads among a trace's `events` (each with `name` and
    `cpu_parent`)."""
    counts = TraceCounts()
    for event in events:
        above = _ancestors(event)
        names = [a.name for a in above]
        in_region = any(name.startswith(REGION) for name in names)
        if _is_read(event.name) and not any(_is_read(name) for name in names):
            counts.reads += 1
        if event.name.startswith(REGION):
            counts.regions += not in_region
        elif not in_region and _is_kernel(event.name) and not any(name.startswith("aten::") for name in names):
            counts.outside += 1
    return counts


def _ancestors(event) -> list:
    above, parent = [], event.cpu_parent
    while parent is not None:
        above.append(parent)
        parent = parent.cpu_parent
    return above


def _is_read(name: str) -> bool:
    if name in _READ_OPERATORS:
        return True
    return name.startswith("<built-in method ") and name.split(" ")[2] in _READ_METHODS and "Tensor" in name


@functools.cache
def _is_kernel(name: str) -> bool:
    """Whether the aten operator `name` (`aten::add`) runs a kernel: not a view, not a bare allocation."""
    if not name.startswith("aten::"):
        return False
    short = name.removeprefix("aten::")
    if short in _NO_KERNEL:
        return False
    packet = getattr(torch.ops.aten, short, None)
    if packet is None:
        return True
    overloads = [getattr(packet, overload) for overload in packet.overloads()]
    return not any(op.is_view for op in overloads)


def per_step(counts: TraceCounts, steps: float) -> dict[str, float]:
    """`counts` per step (graphs compiled as a total)."""
    n = max(steps, 1e-9)
    return {
        "regions": counts.regions / n,
        "outside": counts.outside / n,
        "reads": counts.reads / n,
        "compiled": float(counts.compiled),
    }
