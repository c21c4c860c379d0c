"""Counting a compiled step from a profiler trace: compiled regions entered, operators outside them, host reads and
graphs compiled (`vlmspec profile --compile on`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlmspec.eval.trace_counts import REGION, count_events, traced


@dataclass
class Event:
    """A made-up trace event: its name and the event it ran inside."""

    name: str
    cpu_parent: Event | None = None


def test_a_region_inside_a_region_is_entered_once():
    outer = Event(f"{REGION}: 0/0")
    counts = count_events([outer, Event(f"{REGION}: 1/0", outer), Event(f"{REGION}: 0/0")])
    assert counts.regions == 2


def test_operators_count_outside_regions_at_the_top_level_only():
    region, add = Event(f"{REGION}: 0/0"), Event("aten::add")
    events = [region, Event("aten::mm", region), add, Event("aten::copy_", add), Event("aten::gather")]
    assert count_events(events).outside == 2


def test_views_and_bare_allocations_are_not_operators():
    events = [Event(name) for name in ("aten::view", "aten::select", "aten::empty", "aten::detach_", "aten::slice")]
    assert count_events(events).outside == 0


def test_reads_count_once_wherever_they_run():
    item = Event("aten::item")
    region = Event(f"{REGION}: 0/0")
    tolist = Event("<built-in method tolist of Tensor object at 0x1>")
    events = [
        item,
        Event("aten::_local_scalar_dense", item),
        Event("aten::_local_scalar_dense", region),
        tolist,
        Event("aten::resolve_conj", tolist),
        Event("aten::nonzero"),
        Event("<built-in method tolist of list object at 0x2>"),
    ]
    assert count_events(events).reads == 4


def test_a_compiled_function_is_one_region_and_what_runs_beside_it_is_counted():
    @torch.compile(fullgraph=True, dynamic=False)
    def scores(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ w, -1).topk(3, -1).values.sum(-1)

    x, w = torch.randn(4, 8), torch.randn(8, 16)

    def beside() -> None:
        (scores(x, w) + 1).tolist()

    first, _ = traced(beside)
    again, _ = traced(beside)
    other_shape, _ = traced(lambda: scores(torch.randn(5, 8), w))
    assert (first.regions, first.outside, first.reads, first.compiled) == (1, 1, 1, 1)
    assert (again.regions, again.outside, again.reads, again.compiled) == (1, 1, 1, 0)
    assert (other_shape.regions, other_shape.compiled) == (1, 1)
