"""`vlmspec serve`: load the pair, start its decoding backend, and serve the application with uvicorn."""

from __future__ import annotations

import logging
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
) -> FastAPI:
    """The server's application over `spec` (its processor reads the requests), its backend started: the pair's
    engine, or with `speculation=False` the target's own `generate` (the baseline a plain server gives)."""
    if spec.processor is None:
        raise ValueError("the server needs the pair's processor to read requests: load the pair with from_pretrained")
    backend: Backend = (
        SpeculativeBackend(spec, batch_size, kv_budget_gb) if speculation else PlainBackend(spec, batch_size)
    )
    backend.start()
    config = spec.target.generation_config
    eos = config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return create_app(
        backend,
        spec.processor,
        context_length=spec.context_length,
        config_max_new_tokens=config.max_new_tokens,
        eos_token_ids=eos_ids,
        options=options,
    )


def serve(app: FastAPI, host: str, port: int, **uvicorn_options: Any) -> None:
    """Serve `app` until interrupted (uvicorn's own signal handling shuts it down and closes the backend)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, **uvicorn_options)
