"""Which requests a batch decodes: admission from a source under a row limit and a memory budget, and the slots rows
take when others finish. Pure bookkeeping over requests and row indices, so it is tested without models."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Request(Protocol):
    """What admission reads of a request: its prompt's positions (for the budget), an error it already carries, and
    whether its caller has given up on it (it then takes no row)."""

    @property
    def positions(self) -> int: ...

    @property
    def error(self) -> BaseException | None: ...

    @property
    def cancelled(self) -> bool: ...


R = TypeVar("R", bound=Request)


class Arrivals(Generic[R]):
    """A source whose requests arrive while the batch decodes (a server's): `put` from any thread. The batch takes
    what has arrived without waiting while it has rows in flight, and waits for the next request only when it has
    none, so a quiet source never stalls rows in flight. `close` ends it once everything put has been taken."""

    _END = object()

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, request: R) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(self._END)

    def __len__(self) -> int:
        """Requests put and not yet taken (approximate while other threads put)."""
        return self._queue.qsize()

    def take(self, wait: bool) -> R | None:
        """The next request; None when none has arrived (and `wait` is False). Raises `StopIteration` once closed."""
        try:
            request = self._queue.get(block=wait)
        except queue.Empty:
            return None
        if request is self._END:
            self._queue.put(self._END)
            raise StopIteration
        return request


@dataclass
class Joining(Generic[R]):
    """One round of admission: the requests that join the batch, and those that failed before decoding (they carry
    an `error`; they take no row). Both in the source's order; the failed ones are reported when the round ends."""

    rows: list[R] = field(default_factory=list)
    failed: list[R] = field(default_factory=list)


class Admission(Generic[R]):
    """Admits requests from `source` (an iterable, or `Arrivals`) into a batch of at most `batch_size` rows, in order.
    `admit(in_flight, positions)` may refuse a request of `positions` beside rows of `in_flight` positions (a memory
    budget); a refused request waits, first in line, until a row finishes. A request alone is always admitted
    (nothing would free memory for it). A request cancelled before it joins is reported as failed."""

    def __init__(
        self,
        source: Iterable[R] | Arrivals[R],
        batch_size: int,
        admit: Callable[[list[int], int], bool] | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size = batch_size
        self.admit = admit
        self._arrivals = source if isinstance(source, Arrivals) else None
        self._source: Iterator[R] | None = None if self._arrivals is not None else iter(source)
        self._waiting: R | None = None
        self.exhausted = False

    def _next(self, idle: bool) -> R | None:
        """The next request, or None for none now: an iterable's end exhausts it; arrivals are waited for only when
        the batch is `idle`."""
        if self._arrivals is None:
            request = next(self._source, None)
            self.exhausted = request is None
            return request
        try:
            return self._arrivals.take(wait=idle)
        except StopIteration:
            self.exhausted = True
            return None

    def fill(self, in_flight: list[int]) -> Joining[R]:
        """The requests that join rows of `in_flight` positions now, up to the row limit and the budget."""
        joining: Joining[R] = Joining()
        while len(in_flight) + len(joining.rows) < self.batch_size and not self.exhausted:
            idle = not in_flight and not joining.rows and not joining.failed
            request = self._waiting if self._waiting is not None else self._next(idle)
            self._waiting = None
            if request is None:
                break
            if request.error is not None or request.cancelled:
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
