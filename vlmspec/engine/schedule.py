"""Which requests a batch decodes: admission from a source under a row limit and a memory budget, and the slots rows
take when others finish. Pure bookkeeping over requests and row indices, so it is tested without models."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Request(Protocol):
    """What admission reads of a request: its prompt's positions (for the budget) and an error it already carries."""

    @property
    def positions(self) -> int: ...

    @property
    def error(self) -> BaseException | None: ...


R = TypeVar("R", bound=Request)


@dataclass
class Joining(Generic[R]):
    """One round of admission: the requests that join the batch, and those that failed before decoding (they carry
    an `error`; they take no row). Both in the source's order; the failed ones are reported when the round ends."""

    rows: list[R] = field(default_factory=list)
    failed: list[R] = field(default_factory=list)


class Admission(Generic[R]):
    """Admits requests from `source` into a batch of at most `batch_size` rows, in order. `admit(in_flight,
    positions)` may refuse a request of `positions` beside rows of `in_flight` positions (a memory budget); a refused
    request waits, first in line, until a row finishes. A request alone is always admitted (nothing would free
    memory for it)."""

    def __init__(self, source: Iterable[R], batch_size: int, admit: Callable[[list[int], int], bool] | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.admit = admit
        self._source: Iterator[R] = iter(source)
        self._waiting: R | None = None
        self.exhausted = False

    def fill(self, in_flight: list[int]) -> Joining[R]:
        """The requests that join rows of `in_flight` positions now, up to the row limit and the budget."""
        joining: Joining[R] = Joining()
        while len(in_flight) + len(joining.rows) < self.batch_size and not self.exhausted:
            request = self._waiting if self._waiting is not None else next(self._source, None)
            self._waiting = None
            if request is None:
                self.exhausted = True
                break
            if request.error is not None:
                joining.failed.append(request)
                continue
            occupied = in_flight + [r.positions for r in joining.rows]
            if occupied and self.admit is not None and not self.admit(occupied, request.positions):
                self._waiting = request
                break
            joining.rows.append(request)
        return joining


def compaction(rows: int, done: Iterable[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """How a batch of `rows` closes the gaps its `done` rows leave: each freed slot takes the last row in flight
    (highest freed slot first, so the last slot always holds a row that stays). Returns the moves `(from, to)` in
    the order to make them, and the new order as old row indices."""
    order = list(range(rows))
    moves = []
    for row in sorted(set(done), reverse=True):
        last = len(order) - 1
        if row != last:
            moves.append((last, row))
            order[row] = order[last]
        order.pop()
    return moves, order
