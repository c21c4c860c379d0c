"""The HTTP face of `vlmspec serve`: OpenAI's `/v1/chat/completions` (streamed or not), `/v1/models`, `/health` and
`/metrics`, over one decoding backend that every request joins.

A request is checked on the event loop, its media fetched and processed on worker threads, then each of its choices
joins the backend's running batch; tokens come back as steps emit them. A client that disconnects has its choices
cancelled (their rows are freed at the next step). Past `max_queue` choices waiting, a request is refused with 503 at
once. Every refusal is OpenAI's error object.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.rows import RowResult
from ..errors import RequestCancelled, VLMSpecError
from ..processors.checks import check_context
from ..processors.inputs import VisualInputs
from .backends import Backend, Job, single_threaded_torch
from .chat import ChatRequest, ServeLimits, model_inputs, parse_chat
from .errors import APIError
from .media import MediaFetcher, MediaLimits
from .metrics import ServerMetrics
from .text import TextStream

#: Seconds between checks that a client waiting for a whole answer is still there.
DISCONNECT_POLL = 0.2


@dataclass
class ServerOptions:
    """What the server answers to and how much it takes: the model name it serves, an API key clients must send
    (None: none), how many choices may wait for a row before it answers 503, the largest request body, per-request
    limits, where media may come from, and how many threads read media."""

    served_model_name: str
    api_key: str | None = None
    max_queue: int = 256
    max_body_bytes: int = 64_000_000
    limits: ServeLimits = field(default_factory=ServeLimits)
    media: MediaLimits = field(default_factory=MediaLimits)
    media_workers: int = 4


class _Gate:
    """Choices accepted and not decoding yet, against `max_queue`."""

    def __init__(self, limit: int, metrics: ServerMetrics):
        self.limit = limit
        self.waiting = 0
        self.metrics = metrics
        self._lock = threading.Lock()

    def enter(self, count: int) -> bool:
        with self._lock:
            if self.waiting + count > self.limit:
                return False
            self.waiting += count
            self.metrics.queue_length.set(self.waiting)
            return True

    def leave(self, count: int = 1) -> None:
        with self._lock:
            self.waiting -= count
            self.metrics.queue_length.set(self.waiting)


class _Choice:
    """One choice's events, carried from the decoding thread to the request's event loop."""

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, gate: _Gate, app: _Server):
        self.index = index
        self.loop = loop
        self.queue = queue
        self.gate = gate
        self.app = app
        self.started = False
        self.left_gate = False

    def _leave_gate(self) -> None:
        if not self.left_gate:
            self.left_gate = True
            self.gate.leave()

    def joined(self) -> None:
        self.started = True
        self._leave_gate()
        self.app.metrics.rows_in_flight.inc()

    def _deliver(self, event: list[int] | RowResult) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (self.index, event))
        except RuntimeError:  # the event loop has closed (the server is shutting down): nobody waits for it
            pass

    def tokens(self, ids: list[int]) -> None:
        self._deliver(ids)

    def finished(self, result: RowResult) -> None:
        if self.started:
            self.app.metrics.rows_in_flight.dec()
        self._leave_gate()
        self.app.metrics.sequence_finished(result.stats)
        self._deliver(result)


class _Server:
    """The state behind the routes."""

    def __init__(
        self,
        backend: Backend,
        processor: VisualInputs,
        context_length: int | None,
        config_max_new_tokens: int | None,
        eos_token_ids: set[int],
        options: ServerOptions,
    ):
        self.backend = backend
        self.processor = processor
        self.context_length = context_length
        self.config_max_new_tokens = config_max_new_tokens
        self.eos_token_ids = eos_token_ids
        self.options = options
        self.metrics = ServerMetrics()
        self.gate = _Gate(options.max_queue, self.metrics)
        self.fetcher = MediaFetcher(options.media)
        self.pool = ThreadPoolExecutor(
            options.media_workers, thread_name_prefix="vlmspec-media", initializer=single_threaded_torch
        )
        self.created = int(time.time())

    def authorize(self, request: Request) -> None:
        key = self.options.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(
                401, "a missing or wrong API key: send `Authorization: Bearer <key>`", code="invalid_api_key"
            )

    async def body(self, request: Request) -> Any:
        limit = self.options.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the request body is larger than this server takes ({limit} bytes)", code="too_large")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise APIError(
                    413, f"the request body is larger than this server takes ({limit} bytes)", code="too_large"
                )
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise APIError(400, f"the request body is not valid JSON ({error})", code="invalid_json") from error

    def _prepare(
        self, chat: ChatRequest, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue
    ) -> tuple[list[Job], list[Any], int]:
        """On a worker thread: the request's inputs (media read), checked against the context, and each choice's job
        and what the backend made of it. Returns those and the prompt's length."""
        inputs = model_inputs(chat, self.processor, self.fetcher, self.options.limits)
        length = inputs["input_ids"].shape[1]
        try:
            check_context(
                self.context_length, length, chat.max_new_tokens, remedy="fewer or smaller media or max_tokens"
            )
        except VLMSpecError as error:
            raise APIError(400, str(error), "messages", "context_length_exceeded") from error
        jobs = [
            Job(
                inputs,
                chat.options,
                None if chat.seed is None else chat.seed + i,
                _Choice(i, loop, queue, self.gate, self),
            )
            for i in range(chat.n)
        ]
        try:
            return jobs, self.backend.prepare(jobs), length
        except (VLMSpecError, ValueError, TypeError) as error:
            raise APIError(400, str(error)) from error


def create_app(
    backend: Backend,
    processor: VisualInputs,
    *,
    context_length: int | None,
    config_max_new_tokens: int | None,
    eos_token_ids: set[int],
    options: ServerOptions,
) -> FastAPI:
    """The server's FastAPI application over a started `backend` (closed when the application shuts down)."""
    server = _Server(backend, processor, context_length, config_max_new_tokens, eos_token_ids, options)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        backend.close()
        server.pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="vlmspec", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.server = server
    _add_error_handlers(app)
    _add_info_routes(app, server)
    _add_chat_route(app, server)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal and failure answered as OpenAI's error object: the server's own, HTTP's, and unexpected ones."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(APIError(error.status_code, str(error.detail)).body(), status_code=error.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        return JSONResponse(APIError(500, f"internal error: {type(error).__name__}: {error}").body(), status_code=500)


def _add_info_routes(app: FastAPI, server: _Server) -> None:
    """`/health`, `/metrics` and `/v1/models`: whether the decoding loop runs, its counters, and the model served."""

    @app.get("/health")
    def health() -> Response:
        if not server.backend.alive:
            return JSONResponse({"status": "decoding loop stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(server.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    def models(request: Request) -> dict[str, Any]:
        server.authorize(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": server.options.served_model_name,
                    "object": "model",
                    "created": server.created,
                    "owned_by": "vlmspec",
                    "max_model_len": server.context_length,
                }
            ],
        }


def _add_chat_route(app: FastAPI, server: _Server) -> None:
    """`/v1/chat/completions`: a request checked and admitted against the queue limit, its media prepared on a worker
    thread, its choices submitted to the backend, and the answer streamed or returned whole."""
    backend, options = server.backend, server.options

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        server.authorize(request)
        body = await server.body(request)
        chat = parse_chat(body, options.limits, server.config_max_new_tokens)
        if chat.model != options.served_model_name:
            raise APIError(
                404,
                f"the model {chat.model!r} does not exist; this server serves {options.served_model_name!r}",
                "model",
                "model_not_found",
            )
        if not backend.alive:
            raise APIError(503, "the decoding loop is not running", code="unavailable")
        if chat.n > options.max_queue:
            raise APIError(400, f"n={chat.n} is more than this server queues ({options.max_queue})", "n")
        if not server.gate.enter(chat.n):
            server.metrics.requests.labels("rejected").inc()
            raise APIError(503, "the server is at its queue limit (--max-queue); retry later", code="overloaded")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        try:
            jobs, prepared, prompt_length = await loop.run_in_executor(server.pool, server._prepare, chat, loop, queue)
        except BaseException:
            server.gate.leave(chat.n)
            server.metrics.requests.labels("invalid").inc()
            raise
        arrived = time.perf_counter()
        for p in prepared:
            backend.submit(p)
        answer = _Answer(server, chat, jobs, queue, prompt_length, arrived)
        if chat.stream:
            return StreamingResponse(answer.events(), media_type="text/event-stream")
        return await answer.whole(request)


class _Answer:
    """One request's choices as they decode: collected into one response, or streamed as chunks."""

    def __init__(
        self,
        server: _Server,
        chat: ChatRequest,
        jobs: list[Job],
        queue: asyncio.Queue,
        prompt_length: int,
        arrived: float,
    ):
        self.server = server
        self.chat = chat
        self.jobs = jobs
        self.queue = queue
        self.prompt_length = prompt_length
        self.arrived = arrived
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.texts = [TextStream(server.processor.tokenizer, chat.stop) for _ in jobs]
        self.results: dict[int, RowResult] = {}
        self.first_token = False

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel.set()

    async def _next(self) -> tuple[int, list[int] | RowResult]:
        event = await self.queue.get()
        if not self.first_token and isinstance(event[1], list):
            self.first_token = True
            self.server.metrics.first_token_seconds.observe(time.perf_counter() - self.arrived)
        return event

    def _finish_reason(self, index: int) -> str:
        result = self.results[index]
        new = result.sequence[0, self.prompt_length :].tolist()
        if self.texts[index].stopped or (new and new[-1] in self.server.eos_token_ids):
            return "stop"
        return "length" if len(new) >= self.chat.max_new_tokens else "stop"

    def _usage(self) -> dict[str, int]:
        completion = sum(r.sequence.shape[1] - self.prompt_length for r in self.results.values())
        return {
            "prompt_tokens": self.prompt_length,
            "completion_tokens": completion,
            "total_tokens": self.prompt_length + completion,
        }

    def _speculation(self) -> dict[str, Any]:
        steps = [step for r in self.results.values() if r.stats is not None for step in r.stats.steps]
        accepted = sum(step.accepted for step in steps)
        plain = sum(step.plain is not None for step in steps)
        labels = [r.stats.verification for r in self.results.values() if r.stats is not None]
        return {
            "steps": len(steps),
            "plain_steps": plain,
            "accepted_draft_tokens": accepted,
            "mean_accepted_length": accepted / (len(steps) - plain) if len(steps) > plain else 0.0,
            "verification": next((label for label in labels if label != "exact"), "exact"),
            "differing_tokens": sum(step.differing for step in steps),
        }

    def _failure(self) -> APIError | None:
        """The first failed choice's error as the client sees it (a cancelled one is not reported)."""
        for result in self.results.values():
            error = result.error
            if error is None or isinstance(error, RequestCancelled):
                continue
            if isinstance(error, APIError):
                return error
            if isinstance(error, (VLMSpecError, ValueError, TypeError)):
                return APIError(400, str(error))
            return APIError(500, f"decoding failed: {type(error).__name__}: {error}")
        return None

    def _book(self) -> None:
        metrics = self.server.metrics
        failure = self._failure()
        cancelled = any(isinstance(r.error, RequestCancelled) for r in self.results.values())
        outcome = "error" if failure is not None else "cancelled" if cancelled else "ok"
        metrics.requests.labels(outcome).inc()
        if outcome == "ok":
            usage = self._usage()
            metrics.prompt_tokens.inc(usage["prompt_tokens"])
            metrics.completion_tokens.inc(usage["completion_tokens"])

    async def _watch(self, request: Request) -> None:
        """Cancel the choices once the client has gone away."""
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL)
        self.cancel()

    async def whole(self, request: Request) -> Response:
        """Wait for every choice (cancelling them if the client goes away), then answer at once."""
        watcher = asyncio.create_task(self._watch(request))
        try:
            while len(self.results) < len(self.jobs):
                index, event = await self._next()
                if isinstance(event, RowResult):
                    self.results[index] = event
        finally:
            watcher.cancel()
            if len(self.results) < len(self.jobs):
                self.cancel()
        self._book()
        failure = self._failure()
        if failure is not None:
            raise failure
        if any(isinstance(r.error, RequestCancelled) for r in self.results.values()):
            return Response(status_code=499)
        choices = []
        for index in range(len(self.jobs)):
            text = self.texts[index]
            content = text.feed(self.results[index].sequence[0, self.prompt_length :].tolist()) + text.finish()
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": self._finish_reason(index),
                    "logprobs": None,
                }
            )
        return JSONResponse(
            {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.chat.model,
                "choices": choices,
                "usage": self._usage(),
                "vlmspec": self._speculation(),
            }
        )

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.chat.model,
            "choices": choices,
        }
        if self.chat.include_usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk)}\n\n"

    async def events(self) -> AsyncIterator[str]:
        """Server-sent chunks: the role, then text as it is certain, then each choice's finish reason; usage last
        when asked; `[DONE]`. A client that goes away cancels the choices still decoding."""
        try:
            for index in range(len(self.jobs)):
                yield self._chunk(
                    [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
                )
            while len(self.results) < len(self.jobs):
                index, event = await self._next()
                if isinstance(event, list):
                    delta = self.texts[index].feed(event)
                    if delta:
                        yield self._chunk([{"index": index, "delta": {"content": delta}, "finish_reason": None}])
                    continue
                self.results[index] = event
                if event.error is not None:
                    continue
                rest = self.texts[index].finish()
                if rest:
                    yield self._chunk([{"index": index, "delta": {"content": rest}, "finish_reason": None}])
                reason = self._finish_reason(index)
                yield self._chunk([{"index": index, "delta": {}, "finish_reason": reason}])
            self._book()
            failure = self._failure()
            if failure is not None:
                yield f"data: {json.dumps(failure.body())}\n\n"
            elif self.chat.include_usage:
                yield self._chunk([], self._usage())
            yield "data: [DONE]\n\n"
        finally:
            if len(self.results) < len(self.jobs):
                self.cancel()
                self.server.metrics.requests.labels("cancelled").inc()
