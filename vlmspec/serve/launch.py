"""`vlmspec serve`: load the pair, start its decoding backend, and serve the application with uvicorn."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from fastapi import FastAPI

from ..speculative import SpeculativeVLM
from .app import ServerOptions, create_app
from .backends import Backend, PlainBackend, SpeculativeBackend

log = logging.getLogger("vlmspec.serve")


def build_app(
    spec: SpeculativeVLM,
    options: ServerOptions,
    *,
    batch_size: int = 16,
    kv_budget_gb: float | None = None,
    speculation: bool = True,
    start: bool = True,
) -> FastAPI:
    """The server's application over `spec` (its processor reads the requests) and its backend (`app.state.backend`):
    the pair's engine, or with `speculation=False` the target's own `generate` (the baseline a plain server gives).
    With `start` the backend decodes on a thread of its own; else call its `run` (see `serve`)."""
    if spec.processor is None:
        raise ValueError("the server needs the pair's processor to read requests: load the pair with from_pretrained")
    backend: Backend = (
        SpeculativeBackend(spec, batch_size, kv_budget_gb) if speculation else PlainBackend(spec, batch_size)
    )
    if start:
        backend.start()
    config = spec.target.generation_config
    eos = config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    app = create_app(
        backend,
        spec.processor,
        context_length=spec.context_length,
        config_max_new_tokens=config.max_new_tokens,
        eos_token_ids=eos_ids,
        options=options,
    )
    app.state.backend = backend
    return app


def serve(app: FastAPI, host: str, port: int, **uvicorn_options: Any) -> None:
    """Serve `app` (built with `start=False`) until SIGINT or SIGTERM: HTTP on a thread, decoding on this one (the
    thread that loaded the models, see `backends._Looping`). A signal stops new requests and lets the rows in flight
    finish."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **uvicorn_options))
    backend = app.state.backend

    def answer() -> None:
        try:
            server.run()
        finally:
            backend.close()

    http = threading.Thread(target=answer, name="vlmspec-http", daemon=True)

    def shut_down(signum: int, frame: Any) -> None:
        server.should_exit = True

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, shut_down)
    http.start()
    backend.run()
    http.join()
