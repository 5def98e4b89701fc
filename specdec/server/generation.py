"""One HTTP request's sequences in the engine, from submission to the last event: the events,
the client's disconnect, the abort that frees its cache rows, and the SSE response.

Every generation request that got this far is counted once: ``success`` when its last event
was read, ``aborted`` when the client went away first, ``error`` when the engine failed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from specdec.sequence import Sequence
from specdec.server.async_engine import AsyncEngine, EngineDead, Event, QueueFull, RequestHandle
from specdec.server.errors import APIError, ClientGone
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import Usage, error_body

DISCONNECT_POLL_S = 0.5
RETRY_AFTER_S = 1  # a full queue drains as requests finish: a short wait is worth a retry
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any) -> str:
    """One server-sent event: the object as compact JSON, without the null ``usage`` and
    ``speculative`` fields or a chat delta's null fields, its tool calls' too (as OpenAI
    streams them)."""
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump()
    for key in ("usage", "speculative"):
        if key in obj and obj[key] is None:
            del obj[key]
    for c in obj.get("choices", []):
        if isinstance(c.get("delta"), dict):
            c["delta"] = _without_nulls(c["delta"])
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _without_nulls(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_nulls(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_without_nulls(v) for v in obj]
    return obj


@dataclass
class Generation:
    request: Request
    handle: RequestHandle
    engine: AsyncEngine
    metrics: ServerMetrics
    prompt_tokens: int

    @classmethod
    def submit(cls, request: Request, seqs: list[Sequence], prompt_tokens: int) -> Generation:
        """Hand ``seqs`` to the app's engine: 429 when its queue is full, 503 when it is dead."""
        state = request.app.state
        try:
            handle = state.engine.submit(seqs)
        except QueueFull as exc:
            raise APIError(
                429,
                str(exc),
                type="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from exc
        except EngineDead as exc:
            raise APIError(503, str(exc), type="server_error", code="engine_dead") from exc
        return cls(request, handle, state.engine, state.metrics, prompt_tokens)

    @property
    def done(self) -> bool:
        return self.handle.done

    def usage(self) -> Usage:
        completion = sum(len(s.output_ids) for s in self.handle.seqs)
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
        )

    async def next_event(self) -> Event:
        """The request's next event; raises ClientGone once the client has disconnected
        (checked every DISCONNECT_POLL_S, whether or not events keep coming)."""
        handle = self.handle
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if now - handle.checked >= DISCONNECT_POLL_S:
                handle.checked = now
                if await self.request.is_disconnected():
                    raise ClientGone()
            if not handle.queue.empty():
                ev = handle.queue.get_nowait()
            else:
                try:
                    ev = await asyncio.wait_for(handle.queue.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    continue
            handle.note(ev)
            if ev.error is not None:
                raise APIError(500, ev.error, type="server_error", code="engine_error")
            return ev

    async def collect(self) -> tuple[list[str], list[str | None], list[dict | None]]:
        """Wait for every choice: their texts, finish reasons and metrics."""
        k = len(self.handle.seqs)
        texts, reasons, ms = [""] * k, [None] * k, [None] * k
        try:
            while not self.done:
                ev = await self.next_event()
                texts[ev.index] += ev.text
                if ev.finish_reason is not None:
                    reasons[ev.index], ms[ev.index] = ev.finish_reason, ev.metrics
        except BaseException:  # ClientGone, cancellation, engine failure
            self.abort()
            raise
        self.metrics.count("success")
        return texts, reasons, ms

    def abort(self) -> None:
        """Cancel what is left of the request (idempotent; counted once)."""
        if not self.done and self.engine.abort(self.handle):
            self.metrics.count("aborted")

    def stream(self, events: AsyncIterator[str]) -> StreamingResponse:
        """``events`` as a ``text/event-stream`` response. An engine failure after the headers
        went out ends the stream with an error event; however it ends, the rest is aborted."""

        async def guarded():
            try:
                async for piece in events:
                    yield piece
            except ClientGone:
                pass
            except APIError as exc:  # the engine failed mid-stream: headers are gone already
                self.metrics.count("error")
                body = error_body(exc.message, type=exc.type, code=exc.code)
                yield f"data: {json.dumps(body)}\n\n"
            finally:
                self.abort()  # the client went away (or we failed): free its rows

        return _EngineStream(
            guarded(), on_exit=self.abort, media_type="text/event-stream", headers=SSE_HEADERS
        )


class _EngineStream(StreamingResponse):
    """A streaming response that runs ``on_exit`` however it ends, even when the client
    disconnects before the body generator ever started (its ``finally`` would not run)."""

    def __init__(self, content, on_exit, **kw):
        super().__init__(content, **kw)
        self.on_exit = on_exit

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_exit()
