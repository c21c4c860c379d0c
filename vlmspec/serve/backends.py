"""What decodes the server's requests, on one thread of its own: `SpeculativeBackend` keeps one running batch that
requests join as they arrive (the engine's continuous batching), `PlainBackend` (speculation off) runs the target's
own `generate` over the requests waiting when a batch starts. Both follow one `Job` per choice: its tokens as steps
emit them, its end, its cancellation."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from ..adapters import adapter_for
from ..engine.rows import RowRequest, RowResult
from ..engine.schedule import Arrivals
from ..errors import RequestCancelled
from ..speculative import SpeculativeVLM
from .errors import APIError

log = logging.getLogger("vlmspec.serve")

#: Failures in a row after which the decoding loop fails the requests waiting too, not only those it held.
RESTARTS = 3


class JobEvents(Protocol):
    """Where a job's progress goes (called on the decoding thread)."""

    def joined(self) -> None: ...

    def tokens(self, ids: list[int]) -> None: ...

    def finished(self, result: RowResult) -> None: ...


@dataclass
class Job:
    """One choice to decode: the processor's inputs, `generate`'s arguments, a seed for its own generator (None: the
    global RNG), where its progress goes, and a flag its caller sets to give up on it."""

    inputs: dict[str, Any]
    options: dict[str, Any]
    seed: int | None
    events: JobEvents
    cancel: threading.Event = field(default_factory=threading.Event)

    def generator(self) -> torch.Generator | None:
        """Its own generator, seeded (None: draw from the global RNG, as `generate` does)."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed)


class _Relay:
    """transformers' streamer protocol for one job: the prompt `(1, P)` when its row joins, then new ids `(k,)`."""

    def __init__(self, events: JobEvents):
        self.events = events
        self.started = False

    def put(self, value: torch.Tensor) -> None:
        if value.ndim == 2:
            if not self.started:
                self.started = True
                self.events.joined()
            return
        self.events.tokens(value.tolist())

    def end(self) -> None:
        pass


class Backend(Protocol):
    def prepare(self, jobs: list[Job]) -> list[Any]: ...

    def submit(self, prepared: Any) -> None: ...

    def run(self) -> None: ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    @property
    def alive(self) -> bool: ...


class _Looping:
    """A decoding loop run on the thread that calls `run`, or on a thread of its own (`start`).

    On a CPU, run it on the thread that loaded the models: torch's OpenMP threads belong to the thread that starts
    parallel work, and once a second thread has its own team the OpenMP threads outnumber the cores, libgomp stops
    spin-waiting and every small kernel pays a wake-up (measured: the demo pair's speculative decoding 30-50 % slower).
    Threads that read media therefore run torch on one thread (`single_threaded_torch`).
    """

    def __init__(self, name: str):
        self._name = name
        self._threads = torch.get_num_threads()
        self._thread: threading.Thread | None = None
        self._running = threading.Event()

    def _loop(self) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        """Decode until `close`, on this thread (with as many torch threads as the thread that made the backend)."""
        torch.set_num_threads(self._threads)
        self._running.set()
        try:
            self._loop()
        finally:
            self._running.clear()

    def start(self) -> None:
        """Decode until `close`, on a thread of its own."""
        self._thread = threading.Thread(target=self.run, name=self._name, daemon=True)
        self._thread.start()
        self._running.wait()

    def close(self) -> None:
        """Let the loop finish what it holds and end; waits for it when it runs on its own thread."""
        self._stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._running.is_set()


def single_threaded_torch() -> None:
    """Run this thread's torch work on the thread alone (no OpenMP team beside the decoding thread's)."""
    torch.set_num_threads(1)


class SpeculativeBackend(_Looping):
    """The pair's engine over `Arrivals`: up to `batch_size` rows in flight, within `kv_budget_gb` if given; each
    request decodes exactly as `generate` would decode it alone."""

    def __init__(self, spec: SpeculativeVLM, batch_size: int, kv_budget_gb: float | None = None):
        super().__init__("vlmspec-decode")
        self.spec = spec
        self.batch_size = batch_size
        self.kv_budget_gb = kv_budget_gb
        self.arrivals: Arrivals[RowRequest] = Arrivals()
        self._open: dict[int, Job] = {}
        self._lock = threading.Lock()

    def prepare(self, jobs: list[Job]) -> list[RowRequest]:
        """The engine's requests for one request's choices (raises what `generate` would raise for its arguments).
        The choices share their inputs, so the engine prefills their prompt once."""
        requests = [
            self.spec.prepare(
                job.inputs,
                key=job,
                streamer=_Relay(job.events),
                cancel=job.cancel,
                kv_budget_gb=self.kv_budget_gb,
                generator=job.generator(),
                **job.options,
            )
            for job in jobs
        ]
        first = requests[0]
        return [first] + [
            replace(r, target_inputs=first.target_inputs, draft_inputs=first.draft_inputs, prompt=first.prompt)
            for r in requests[1:]
        ]

    def submit(self, prepared: RowRequest) -> None:
        with self._lock:
            self._open[id(prepared.key)] = prepared.key
            self.arrivals.put(prepared)

    def _stop(self) -> None:
        self.arrivals.close()

    def _loop(self) -> None:
        failures = 0
        while True:
            try:
                for result in self.spec.decode(self.arrivals, self.batch_size, kv_budget_gb=self.kv_budget_gb):
                    failures = 0
                    with self._lock:
                        self._open.pop(id(result.key), None)
                    result.key.events.finished(result)
                break
            except Exception as error:  # noqa: BLE001 - the loop outlives a failing batch; its rows fail, not the server
                failures += 1
                log.exception("the decoding loop failed; the rows it held are failed and it starts again")
                closed = self._fail_taken(error, everything=failures >= RESTARTS)
                if closed:
                    break
                time.sleep(min(5.0, 0.1 * 2**failures))
        self._fail_taken(RuntimeError("the server is shutting down"), everything=True)

    def _fail_taken(self, error: Exception, everything: bool = False) -> bool:
        """Fail every job the failed loop had taken (with `everything`, the waiting ones too; after repeated failures
        nothing is kept waiting for a loop that keeps failing); the others decode when it starts again. Returns
        whether `arrivals` was closed."""
        waiting, closed = [], False
        with self._lock:
            try:
                while (request := self.arrivals.take(wait=False)) is not None:
                    waiting.append(request)
            except StopIteration:
                closed = True
            kept = set() if everything else {id(request.key) for request in waiting}
            lost = [job for key, job in self._open.items() if key not in kept]
            self._open = {key: job for key, job in self._open.items() if key in kept}
            for request in waiting if not everything else []:
                self.arrivals.put(request)
            if closed:
                self.arrivals.close()
        for job in lost:
            job.events.finished(RowResult(job, None, None, error))
        return closed


class _CancelledRows(StoppingCriteria):
    """Stops the rows of a plain batch whose callers gave up (per row, as `generate` asks of a criterion)."""

    def __init__(self, jobs: list[Job]):
        self.jobs = jobs

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        flags = [job.cancel.is_set() for job in self.jobs]
        return torch.tensor(flags, dtype=torch.bool, device=input_ids.device)


class _BatchRelay:
    """A streamer over a plain batch: each step's (B,) tokens to their jobs, until a row's EOS or its cancellation."""

    def __init__(self, jobs: list[Job], eos: set[int]):
        self.jobs = jobs
        self.eos = eos
        self.started = False
        self.done = [False] * len(jobs)

    def put(self, value: torch.Tensor) -> None:
        if not self.started:
            self.started = True
            for job in self.jobs:
                job.events.joined()
            return
        for b, token in enumerate(value.reshape(-1).tolist()):
            if self.done[b] or self.jobs[b].cancel.is_set():
                self.done[b] = True
                continue
            self.jobs[b].events.tokens([token])
            self.done[b] = token in self.eos

    def end(self) -> None:
        pass


class PlainBackend(_Looping):
    """Speculation off: the target's own `generate` over a left-padded batch of the jobs waiting when it starts (up to
    `batch_size`, those with equal arguments; a seeded job runs alone), streamed a token per step. Jobs that arrive
    while a batch runs wait for the next batch."""

    def __init__(self, spec: SpeculativeVLM, batch_size: int):
        super().__init__("vlmspec-plain")
        self.target = spec.target
        self.batch_size = batch_size
        self.adapter = adapter_for(spec.target)
        self.pad_token_id = spec.processor.tokenizer.pad_token_id
        self.tokenizer = spec.processor.tokenizer
        self._waiting: deque[Job] = deque()
        self._ready = threading.Condition()
        self._closed = False

    def prepare(self, jobs: list[Job]) -> list[Job]:
        """The jobs with their inputs on the target's device; a request for relaxed verification, which the target's
        own `generate` has not, is refused."""
        for job in jobs:
            if job.options.pop("verification", "exact") != "exact":
                raise APIError(
                    400,
                    "verification='relaxed' needs speculation, and this server runs with --speculation off",
                    "verification",
                )
        device = self.target.device
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in jobs[0].inputs.items()}
        for job in jobs:
            job.inputs = inputs
        return jobs

    def submit(self, prepared: Job) -> None:
        with self._ready:
            self._waiting.append(prepared)
            self._ready.notify()

    def _stop(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()

    def _next_batch(self) -> list[Job] | None:
        with self._ready:
            while not self._waiting and not self._closed:
                self._ready.wait()
            if not self._waiting:
                return None
            first = self._waiting.popleft()
            batch = [first]
            if first.seed is None:
                for job in list(self._waiting):
                    if len(batch) == self.batch_size:
                        break
                    if job.seed is None and job.options == first.options:
                        self._waiting.remove(job)
                        batch.append(job)
            return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            live = [job for job in batch if not job.cancel.is_set()]
            for job in batch:
                if job.cancel.is_set():
                    job.events.finished(RowResult(job, None, None, RequestCancelled("cancelled before it ran")))
            if live:
                try:
                    self._run(live)
                except Exception:  # noqa: BLE001 - a batch that fails to deliver fails alone, not the loop
                    log.exception("a plain batch failed")

    @torch.inference_mode()
    def _run(self, jobs: list[Job]) -> None:
        try:
            rows = [job.inputs for job in jobs]
            inputs = rows[0] if len(rows) == 1 else self.adapter.join_rows(rows, self.pad_token_id)
            eos = self.target.generation_config.eos_token_id
            eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
            options = dict(jobs[0].options)
            if "stop_strings" in options:
                options["tokenizer"] = self.tokenizer
            if jobs[0].seed is not None:
                torch.manual_seed(jobs[0].seed)
            sequences = self.target.generate(
                **inputs,
                **options,
                streamer=_BatchRelay(jobs, eos),
                stopping_criteria=StoppingCriteriaList([_CancelledRows(jobs)]),
            )
        except Exception as error:  # noqa: BLE001 - a failing batch fails its jobs, not the server
            for job in jobs:
                job.events.finished(RowResult(job, None, None, error))
            return
        length = inputs["input_ids"].shape[1]
        pad = self.target.generation_config.pad_token_id
        for b, job in enumerate(jobs):
            new = sequences[b, length:].tolist()
            ends = [i for i, token in enumerate(new) if token in eos]
            new = new[: ends[0] + 1] if ends else new
            while not ends and len(jobs) > 1 and new and new[-1] == pad and pad not in eos:
                new.pop()  # a row stopped by a stop string is padded while the others go on
            prompt = job.inputs["input_ids"]
            sequence = torch.cat([prompt.cpu(), torch.tensor([new], dtype=prompt.dtype)], dim=1)
            error = RequestCancelled("its caller cancelled it") if job.cancel.is_set() else None
            job.events.finished(RowResult(job, sequence, None, error))
