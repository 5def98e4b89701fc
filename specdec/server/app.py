"""The OpenAI-compatible HTTP server's app: ``create_app(llm, ...)`` wires an ``LLM`` (its engine
runs in a background thread, see ``async_engine``) to the routes (``routes``), the API's errors
(``errors``) and the guard of the API key and the body's size and deadline (``guard``).
``specdec serve`` runs it (``specdec.cli.serve``) on uvicorn with the header deadline
(``connection``).

Defaults (OpenAI's where OpenAI has one): temperature 1.0, top_p 1.0, n 1; ``max_tokens`` 16
for ``/v1/completions`` and the rest of the context (``max_model_len`` minus the prompt) for
``/v1/chat/completions``. Extensions: ``top_k``, ``ignore_eos``, ``stop_token_ids`` in the
request, and a ``speculative`` object in the response (the request's decoding metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from specdec.server.async_engine import AsyncEngine
from specdec.server.errors import add_exception_handlers
from specdec.server.guard import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, GuardMiddleware
from specdec.server.metrics import ServerMetrics
from specdec.server.routes import router

log = logging.getLogger("specdec.server")


@asynccontextmanager
async def _lifespan(app: FastAPI):
    """Start the engine thread (reserving the caches) with the app; stop it on shutdown."""
    state = app.state
    state.engine.start()
    log.info(
        "serving %s (%s) with up to %d running + %d waiting requests of <= %d tokens",
        state.model_name,
        state.llm.method,
        state.engine.max_num_seqs,
        state.engine.max_waiting,
        state.engine.max_model_len,
    )
    try:
        yield
    finally:
        await asyncio.to_thread(state.engine.stop)


def create_app(
    llm,
    model_name: str | None = None,
    *,
    api_key: str | None = None,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    max_waiting: int = 64,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
    """An app serving ``llm`` under ``model_name``. The engine thread starts (and caches are
    reserved) when the app starts up, and stops when it shuts down."""
    metrics = ServerMetrics()
    engine = AsyncEngine(
        llm,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        max_waiting=max_waiting,
        on_finished=metrics.finished,
    )
    metrics.bind_engine(
        running=lambda: engine.num_running,
        waiting=lambda: engine.num_waiting,
        alive=lambda: engine.alive,
        busy=lambda: engine.busy_s,
        steps=lambda: engine.steps,
    )
    app = FastAPI(title="specdec", lifespan=_lifespan, docs_url=None, redoc_url=None)
    app.state.llm = llm
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.model_name = model_name or str(llm.model_path.name)
    app.state.created = int(time.time())
    app.add_middleware(
        GuardMiddleware,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        on_reject=metrics.count,
        body_timeout_s=body_timeout_s,
    )
    add_exception_handlers(app)
    app.include_router(router)
    return app
