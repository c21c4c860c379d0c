"""The batch's scheduling, without models: admission under a row limit and a memory budget, the slots rows take when
others finish, and both together over a fake decoder whose rows finish after a set number of steps."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from vlmspec.engine.schedule import Admission, Arrivals, compaction


@dataclass
class Fake:
    """A request: its prompt's positions, the steps it decodes for, an error it may already carry, and whether its
    caller gave up on it."""

    name: str
    positions: int = 10
    steps: int = 1
    error: BaseException | None = None
    cancelled: bool = False


def requests(*specs: int | tuple[int, ...]) -> list[Fake]:
    """Requests named r0, r1, ...: an int gives the steps, a tuple the positions (and the steps)."""
    return [Fake(f"r{i}", *s) if isinstance(s, tuple) else Fake(f"r{i}", steps=s) for i, s in enumerate(specs)]


def test_admission_fills_free_rows_in_order():
    admission = Admission(requests(1, 1, 1, 1, 1), batch_size=3)
    assert [r.name for r in admission.fill([]).rows] == ["r0", "r1", "r2"]
    assert [r.name for r in admission.fill([10]).rows] == ["r3", "r4"]
    assert admission.fill([]).rows == [] and admission.exhausted


def test_a_request_with_an_error_is_reported_and_takes_no_row():
    source = requests(1, 1, 1)
    source[1].error = ValueError("unreadable video")
    joining = Admission(source, batch_size=2).fill([])
    assert [r.name for r in joining.failed] == ["r1"]
    assert [r.name for r in joining.rows] == ["r0", "r2"]


def test_a_refused_request_waits_first_in_line_until_a_row_finishes():
    budget = 25
    seen = []

    def admit(in_flight: list[int], positions: int) -> bool:
        seen.append((list(in_flight), positions))
        return sum(in_flight) + positions <= budget

    admission = Admission(requests((10,), (10,), (10,), (4,)), batch_size=4, admit=admit)
    assert [r.name for r in admission.fill([]).rows] == ["r0", "r1"]
    assert seen == [([10], 10), ([10, 10], 10)]
    assert admission.fill([10, 10]).rows == []
    assert [r.name for r in admission.fill([10]).rows] == ["r2", "r3"]
    assert admission.exhausted


def test_a_request_alone_is_admitted_whatever_the_budget():
    admission = Admission(requests((1000,)), batch_size=2, admit=lambda in_flight, positions: False)
    assert [r.name for r in admission.fill([]).rows] == ["r0"]


def test_admission_refuses_a_batch_of_no_rows():
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        Admission([], batch_size=0)


@pytest.mark.parametrize(
    ("rows", "done", "moves", "order"),
    [
        (4, [1], [(3, 1)], [0, 3, 2]),
        (4, [3], [], [0, 1, 2]),
        (5, [0, 3], [(4, 3), (3, 0)], [4, 1, 2]),
        (4, [2, 3], [], [0, 1]),
        (4, [0, 1, 2, 3], [], []),
        (3, [1, 1], [(2, 1)], [0, 2]),
    ],
)
def test_each_freed_slot_takes_the_last_row_in_flight(rows, done, moves, order):
    assert compaction(rows, done) == (moves, order)


def test_compaction_moves_keep_every_surviving_row_once():
    for rows in range(1, 7):
        for mask in range(1 << rows):
            done = [b for b in range(rows) if mask >> b & 1]
            moves, order = compaction(rows, done)
            slots = list(range(rows))
            for source, slot in moves:
                slots[slot] = slots[source]
            assert slots[: len(order)] == order
            assert sorted(order) == [b for b in range(rows) if b not in done]


def simulate(source: list[Fake], batch_size: int, admit=None) -> tuple[list[str], int, list[list[str]]]:
    """Run the scheduler over a fake decoder: every step each row in flight decodes once; a row whose steps are done
    leaves and its slot is filled as the batch does. Returns the finishing order, the most rows in flight, and the
    rows in flight at each step."""
    admission = Admission(source, batch_size, admit)
    rows: list[list] = []
    finished, widest, history = [], 0, []
    while True:
        joining = admission.fill([request.positions for request, _ in rows])
        finished += [r.name for r in joining.failed]
        rows += [[r, 0] for r in joining.rows]
        if not rows:
            return finished, widest, history
        widest = max(widest, len(rows))
        history.append([r.name for r, _ in rows])
        for row in rows:
            row[1] += 1
        done = [b for b, (request, steps) in enumerate(rows) if steps == request.steps]
        _, order = compaction(len(rows), done)
        finished += [rows[b][0].name for b in done]
        rows = [rows[b] for b in order]


def test_over_a_fake_decoder_every_request_finishes_once_within_the_row_limit():
    source = requests(3, 1, 4, 2, 1, 5, 2)
    finished, widest, history = simulate(source, batch_size=3)
    assert sorted(finished) == sorted(r.name for r in source) and len(finished) == len(source)
    assert widest == 3 and all(len(step) <= 3 for step in history)
    assert history[:2] == [["r0", "r1", "r2"], ["r0", "r2", "r3"]]


def test_over_a_fake_decoder_the_budget_holds_at_every_step():
    source = requests((12, 2), (12, 3), (12, 1), (30, 1), (5, 2))
    budget = 30
    finished, _, history = simulate(source, 4, lambda in_flight, positions: sum(in_flight) + positions <= budget)
    sizes = {r.name: r.positions for r in source}
    assert len(finished) == len(source)
    assert all(len(step) == 1 or sum(sizes[name] for name in step) <= budget for step in history)
    assert ["r3"] in history


def test_a_request_cancelled_before_it_joins_is_failed_and_takes_no_row():
    source = requests(1, 1, 1)
    source[1].cancelled = True
    joining = Admission(source, batch_size=2).fill([])
    assert [r.name for r in joining.rows] == ["r0", "r2"] and [r.name for r in joining.failed] == ["r1"]


def test_arrivals_with_rows_in_flight_take_what_has_arrived_and_never_wait():
    arrivals = Arrivals()
    admission = Admission(arrivals, batch_size=4)
    assert admission.fill([10]).rows == [] and not admission.exhausted
    arrivals.put(Fake("a"))
    arrivals.put(Fake("b"))
    assert [r.name for r in admission.fill([10]).rows] == ["a", "b"] and not admission.exhausted


def test_arrivals_with_no_rows_in_flight_wait_for_the_next_request():
    arrivals = Arrivals()
    admission = Admission(arrivals, batch_size=4)
    timer = threading.Timer(0.2, arrivals.put, [Fake("late")])
    timer.start()
    started = time.perf_counter()
    joined = admission.fill([]).rows
    assert [r.name for r in joined] == ["late"] and time.perf_counter() - started >= 0.15
    timer.join()


def test_closed_arrivals_are_exhausted_once_every_request_put_is_taken():
    arrivals = Arrivals()
    arrivals.put(Fake("a"))
    arrivals.close()
    admission = Admission(arrivals, batch_size=1)
    assert [r.name for r in admission.fill([]).rows] == ["a"] and not admission.exhausted
    assert admission.fill([]).rows == [] and admission.exhausted


def test_arrivals_over_a_fake_decoder_serve_every_request_put_while_it_runs():
    arrivals = Arrivals()
    for spec in requests(2, 1, 3):
        arrivals.put(spec)
    late = [Fake(f"late{i}", steps=i + 1) for i in range(3)]

    def put_late():
        for request in late:
            arrivals.put(request)
        arrivals.close()

    threading.Timer(0.05, put_late).start()
    finished, widest, _ = simulate(arrivals, batch_size=2)
    assert sorted(finished) == sorted(["r0", "r1", "r2", "late0", "late1", "late2"]) and widest == 2
