"""The OpenAI-compatible HTTP server: routes, errors, auth, body limit, streaming.

``create_app(llm, ...)`` builds a FastAPI app around an ``LLM`` (its engine runs in a
background thread, see ``async_engine``); ``serve(args)`` is ``specdec serve``.

Defaults (OpenAI's where OpenAI has one): temperature 1.0, top_p 1.0, n 1; ``max_tokens`` 16
for ``/v1/completions`` and the rest of the context (``max_model_len`` minus the prompt) for
``/v1/chat/completions``. Extensions: ``top_k``, ``ignore_eos``, ``stop_token_ids`` in the
request, and a ``speculative`` object in the response (the request's decoding metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.sampling import SamplingParams
from specdec.server.async_engine import AsyncEngine, EngineDead, Event, QueueFull, RequestHandle
from specdec.server.metrics import CONTENT_TYPE, ServerMetrics, ssd_hit_rate
from specdec.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    ModelCard,
    ModelList,
    Usage,
    error_body,
)

log = logging.getLogger("specdec.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 128
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
DISCONNECT_POLL_S = 0.5


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )


class ClientGone(Exception):
    pass


def _error_response(status: int, message: str, **kw) -> JSONResponse:
    return JSONResponse(error_body(message, **kw), status_code=status)


# -- the request's speculative metrics --------------------------------------------------------
_KEYS = (
    "method",
    "tokens_per_s",
    "decode_tokens_per_s",
    "time_to_first_token_s",
    "wall_time_s",
    "rounds",
    "target_forwards",
    "drafted_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "mean_tokens_per_round",
    "per_position_acceptance",
)


def speculative_info(metrics: list[dict], method: str) -> dict[str, Any]:
    """The ``speculative`` object of a response: one request's metrics (``method``, tokens/s,
    and for speculative methods acceptance rate, mean tokens per round and ``ssd_*``), or, for
    n > 1 choices, their totals."""
    if len(metrics) == 1:
        m = metrics[0]
        out = {k: m[k] for k in _KEYS if k in m and m[k] is not None}
        out.update({k: v for k, v in m.items() if k.startswith("ssd_")})
        return out
    gen = sum(m.get("generated_tokens", 0) for m in metrics)
    wall = max((m.get("wall_time_s", 0.0) for m in metrics), default=0.0)
    out: dict[str, Any] = {
        "method": method,
        "tokens_per_s": gen / max(wall, 1e-9),
        "wall_time_s": wall,
        "rounds": sum(m.get("rounds", 0) for m in metrics),
        "target_forwards": sum(m.get("target_forwards", 0) for m in metrics),
    }
    spec = [m for m in metrics if m.get("drafted_tokens")]
    if spec:
        drafted = sum(m["drafted_tokens"] for m in spec)
        accepted = sum(m["accepted_tokens"] for m in spec)
        rounds = sum(sum(m.get("accepted_length_histogram", {}).values()) for m in spec)
        out.update(
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            acceptance_rate=accepted / drafted,
            mean_tokens_per_round=(accepted + rounds) / max(rounds, 1),
        )
    hits = [h for h in (ssd_hit_rate(m) for m in metrics) if h is not None]
    if hits:
        out["ssd_hit_rate"] = sum(hits) / len(hits)
    return out


def _usage(handle: RequestHandle, prompt_tokens: int) -> Usage:
    completion = sum(len(s.output_ids) for s in handle.seqs)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
    )


def _sse(obj: Any) -> str:
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump()
    for key in ("usage", "speculative"):
        if key in obj and obj[key] is None:
            del obj[key]
    for c in obj.get("choices", []):
        if isinstance(c.get("delta"), dict):
            c["delta"] = {k: v for k, v in c["delta"].items() if v is not None}
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


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


# -- middleware: API key and body size ---------------------------------------------------------
class GuardMiddleware:
    """Pure ASGI: checks ``Authorization: Bearer KEY`` (every path but /health) and caps the
    request body at ``max_body_bytes`` (413), reading it once and replaying it to the app."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, on_reject=None):
        self.app = app
        self.api_key = api_key
        self.max_body = max_body_bytes
        self.drain_cap = max(16 * max_body_bytes, 64 << 20)
        self.on_reject = on_reject

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope.get("path", "")
        if self.api_key and path != "/health":
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.api_key.encode()
            ):
                await self._drain(receive, headers)
                msg = (
                    "Incorrect API key provided."
                    if auth
                    else "Missing API key: send the header 'Authorization: Bearer KEY'."
                )
                return await _error_response(401, msg, param=None, code="invalid_api_key").__call__(
                    scope, receive, send
                )
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body, too_big, gone = await self._read(receive, headers)
        if gone:
            return
        if too_big:
            if self.on_reject is not None and path in GENERATION_PATHS:
                self.on_reject("invalid")
            resp = _error_response(
                413,
                f"request body too large: the limit is {self.max_body} bytes",
                code="request_too_large",
            )
            return await resp(scope, receive, send)
        done = False

        async def replay():
            nonlocal done
            if not done:
                done = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive, headers) -> tuple[bytes, bool, bool]:
        try:
            declared = int(headers.get("content-length", "0") or 0)
        except ValueError:
            declared = 0
        if declared > self.drain_cap:  # do not even drain it
            return b"", True, False
        too_big = declared > self.max_body
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return b"", False, True
            data = msg.get("body", b"")
            size += len(data)
            if size > self.max_body:
                too_big = True
                chunks.clear()
            elif not too_big:
                chunks.append(data)
            if not msg.get("more_body", False) or size > self.drain_cap:
                break
        return b"".join(chunks), too_big, False

    async def _drain(self, receive, headers) -> None:
        if headers.get("content-length", "0") in ("", "0") and "transfer-encoding" not in headers:
            return
        await self._read(receive, headers)


# -- the app -----------------------------------------------------------------------------------
def create_app(
    llm,
    model_name: str | None = None,
    *,
    api_key: str | None = None,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    max_waiting: int = 64,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """An app serving ``llm`` under ``model_name``. The engine thread starts (and caches are
    reserved) when the app starts up, and stops when it shuts down."""
    model_name = model_name or str(llm.model_path.name)
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
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        log.info(
            "serving %s (%s) with up to %d running + %d waiting requests of <= %d tokens",
            model_name,
            llm.method,
            max_num_seqs,
            max_waiting,
            engine.max_model_len,
        )
        try:
            yield
        finally:
            await asyncio.to_thread(engine.stop)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.llm = llm
    app.state.model_name = model_name
    app.add_middleware(
        GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes, on_reject=metrics.count
    )

    # -- errors ------------------------------------------------------------------------------
    def _count_error(request: Request, status: int) -> None:
        if request.url.path in GENERATION_PATHS:
            if status == 429:
                metrics.count("rejected")
            elif status >= 500:
                metrics.count("error")
            else:
                metrics.count("invalid")

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        _count_error(request, exc.status)
        return _error_response(
            exc.status, exc.message, type=exc.type, param=exc.param, code=exc.code
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        _count_error(request, 400)
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error_response(400, "malformed JSON in the request body", code="invalid_json")
        groups: dict[str, list[tuple[list[str], dict]]] = {}
        for e in errors:
            loc = [str(x) for x in e.get("loc", ()) if x != "body"]
            groups.setdefault(loc[0] if loc else "", []).append((loc, e))
        parts = []
        for field, es in list(groups.items())[:5]:
            loc, e = es[0]
            if len(es) > 1 and all(len(lc) == 2 for lc, _ in es):  # a union's alternatives
                got = repr(e.get("input"))[:60]
                expected = ", ".join(lc[1] for lc, _ in es)
                parts.append(f"{field}: {got} is not valid (expected one of: {expected})")
            else:
                where = ".".join(loc)
                parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
        param = next(iter(groups), "") or None
        msg = "invalid request: " + "; ".join(parts)
        return _error_response(400, msg, param=param, code="invalid_value")

    @app.exception_handler(ClientGone)
    async def _client_gone(request: Request, exc: ClientGone):
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error_response(exc.status_code, str(exc.detail), code=code)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception):
        log.exception("unhandled error in %s", request.url.path)
        _count_error(request, 500)
        return _error_response(
            500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"
        )

    # -- helpers -----------------------------------------------------------------------------
    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(
                404,
                f"The model '{name}' does not exist (this server serves '{model_name}')",
                param="model",
                code="model_not_found",
            )

    def check_common(req) -> int:
        check_model(req.model)
        bad = req.unsupported()
        if bad:
            raise APIError(
                400,
                f"unsupported parameter: {bad[0]} (specdec does not implement it)",
                param=bad[0],
                code="unsupported_parameter",
            )
        n = 1 if req.n is None else req.n
        if not 1 <= n <= MAX_N:
            raise APIError(400, f"n must be in [1, {MAX_N}], got {n}", param="n")
        return n

    def params_for(req, max_tokens: int, seed: int | None) -> SamplingParams:
        top_k = 0 if req.top_k in (None, -1) else req.top_k
        try:
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=top_k,
                max_tokens=max_tokens,
                seed=seed,
                stop=req.stop,
                stop_token_ids=req.stop_token_ids,
                ignore_eos=bool(req.ignore_eos),
            )
        except ValueError as exc:
            msg = str(exc)
            param = next(
                (
                    p
                    for p in (
                        "temperature",
                        "top_p",
                        "top_k",
                        "max_tokens",
                        "seed",
                        "stop_token_ids",
                        "stop",
                    )
                    if msg.removeprefix("invalid sampling parameter: ").startswith(p)
                ),
                None,
            )
            raise APIError(400, msg, param=param, code="invalid_value") from exc

    def make_request(prompt, params: SamplingParams, request_id: str, label: str, param: str):
        try:
            return llm.make_request(prompt, params, request_id)
        except ValueError as exc:
            msg = str(exc).replace("prompt 0 ", label, 1)
            code = "context_length_exceeded" if "context" in msg else "invalid_value"
            raise APIError(400, msg, param=param, code=code) from exc

    def submit(seqs) -> RequestHandle:
        try:
            return engine.submit(seqs)
        except QueueFull as exc:
            raise APIError(429, str(exc), type="rate_limit_error", code="queue_full") from exc
        except EngineDead as exc:
            raise APIError(503, str(exc), type="server_error", code="engine_dead") from exc

    def check_capacity(n: int) -> None:
        if n > engine.capacity:
            raise APIError(
                400,
                f"{n} choices exceed the server's capacity of {engine.capacity} requests",
                param="n",
            )

    async def next_event(handle: RequestHandle, request: Request) -> Event:
        """The request's next event; raises ClientGone once the client has disconnected
        (checked every DISCONNECT_POLL_S, whether or not events keep coming)."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if now - handle.checked >= DISCONNECT_POLL_S:
                handle.checked = now
                if await request.is_disconnected():
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

    async def collect(handle: RequestHandle, request: Request):
        """Wait for every choice of a non-streamed request."""
        k = len(handle.seqs)
        texts, reasons, ms = [""] * k, [None] * k, [None] * k
        try:
            while not handle.done:
                ev = await next_event(handle, request)
                texts[ev.index] += ev.text
                if ev.finish_reason is not None:
                    reasons[ev.index], ms[ev.index] = ev.finish_reason, ev.metrics
        except BaseException:  # ClientGone, cancellation, engine failure
            abort(handle)
            raise
        metrics.count("success")
        return texts, reasons, ms

    def abort(handle: RequestHandle) -> None:
        """Cancel what is left of a request (idempotent; counted once)."""
        if not handle.done and engine.abort(handle):
            metrics.count("aborted")

    def stream(gen: AsyncIterator[str], handle: RequestHandle) -> StreamingResponse:
        async def guarded():
            try:
                async for piece in gen:
                    yield piece
            except ClientGone:
                pass
            except APIError as exc:  # the engine failed mid-stream: headers are gone already
                metrics.count("error")
                body = error_body(exc.message, type=exc.type, code=exc.code)
                yield f"data: {json.dumps(body)}\n\n"
            finally:
                abort(handle)  # the client went away (or we failed): free its rows

        return _EngineStream(
            guarded(),
            on_exit=lambda: abort(handle),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    # -- routes ------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if engine.alive:
            return {"status": "ok"}
        reason = repr(engine.error) if engine.error else "the engine thread is not running"
        return JSONResponse({"status": "error", "error": reason}, status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models():
        return ModelList(
            data=[ModelCard(id=model_name, created=created, max_model_len=engine.max_model_len)]
        )

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        check_model(name)
        return ModelCard(id=model_name, created=created, max_model_len=engine.max_model_len)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        n = check_common(req)
        p = req.prompt
        if isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], int)):
            prompts = [p]
        elif isinstance(p, list) and not p:
            prompts = [p]  # an empty token list: make_request says "empty"
        else:
            prompts = list(p)
        max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        check_capacity(len(prompts) * n)
        rid = f"cmpl-{uuid.uuid4().hex}"

        def build():
            seqs = []
            for i, prompt in enumerate(prompts):
                for j in range(n):
                    seed = None if req.seed is None else req.seed + j
                    params = params_for(req, max_tokens, seed)
                    seqs.append(
                        make_request(
                            prompt,
                            params,
                            f"{rid}-{len(seqs)}",
                            "prompt " if len(prompts) == 1 else f"prompt {i} ",
                            "prompt",
                        )
                    )
            return seqs

        seqs = await asyncio.to_thread(build)
        prompt_tokens = sum(len(seqs[i * n].prompt_ids) for i in range(len(prompts)))
        handle = submit(seqs)
        now = int(time.time())

        if not req.stream:
            texts, reasons, ms = await collect(handle, request)
            return Completion(
                id=rid,
                created=now,
                model=model_name,
                choices=[
                    CompletionChoice(index=i, text=t, finish_reason=r)
                    for i, (t, r) in enumerate(zip(texts, reasons))
                ],
                usage=_usage(handle, prompt_tokens),
                speculative=speculative_info(ms, llm.method),
            )

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices, **kw) -> str:
            return _sse(Completion(id=rid, created=now, model=model_name, choices=choices, **kw))

        async def gen():
            ms: list[dict | None] = [None] * len(seqs)
            while not handle.done:
                ev = await next_event(handle, request)
                last = False
                if ev.finish_reason is not None:
                    ms[ev.index] = ev.metrics
                    last = handle.done
                if ev.text or ev.finish_reason is not None:
                    spec = speculative_info(ms, llm.method) if last and not include_usage else None
                    choice = CompletionChoice(
                        index=ev.index, text=ev.text, finish_reason=ev.finish_reason
                    )
                    yield chunk([choice], speculative=spec)
            metrics.count("success")
            if include_usage:
                yield chunk(
                    [],
                    usage=_usage(handle, prompt_tokens),
                    speculative=speculative_info(ms, llm.method),
                )
            yield "data: [DONE]\n\n"

        return stream(gen(), handle)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        n = check_common(req)
        check_capacity(n)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        messages = [m.as_template_input() for m in req.messages]
        limit = req.max_completion_tokens
        if limit is None:
            limit = req.max_tokens

        def build():
            try:
                ids = llm.chat_prompt(messages)
            except Exception as exc:  # noqa: BLE001 - template errors are the input's fault
                raise APIError(
                    400, f"could not apply the chat template: {exc}", param="messages"
                ) from exc
            if limit is None:  # default: the rest of the context
                max_tokens = engine.max_model_len - len(ids)
                if max_tokens < 1:
                    raise APIError(
                        400,
                        f"the messages take {len(ids)} tokens, the whole context of "
                        f"{engine.max_model_len} tokens",
                        param="messages",
                        code="context_length_exceeded",
                    )
            else:
                max_tokens = limit
            seqs = []
            for j in range(n):
                seed = None if req.seed is None else req.seed + j
                params = params_for(req, max_tokens, seed)
                seqs.append(make_request(ids, params, f"{rid}-{j}", "prompt ", "messages"))
            return seqs

        seqs = await asyncio.to_thread(build)
        prompt_tokens = len(seqs[0].prompt_ids)
        handle = submit(seqs)
        now = int(time.time())

        if not req.stream:
            texts, reasons, ms = await collect(handle, request)
            return ChatCompletion(
                id=rid,
                created=now,
                model=model_name,
                choices=[
                    ChatChoice(index=i, message=AssistantMessage(content=t), finish_reason=r)
                    for i, (t, r) in enumerate(zip(texts, reasons))
                ],
                usage=_usage(handle, prompt_tokens),
                speculative=speculative_info(ms, llm.method),
            )

        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices, **kw) -> str:
            return _sse(
                ChatCompletionChunk(id=rid, created=now, model=model_name, choices=choices, **kw)
            )

        async def gen():
            for j in range(n):
                yield chunk([ChatChunkChoice(index=j, delta=Delta(role="assistant", content=""))])
            ms: list[dict | None] = [None] * n
            while not handle.done:
                ev = await next_event(handle, request)
                if ev.text:
                    yield chunk([ChatChunkChoice(index=ev.index, delta=Delta(content=ev.text))])
                if ev.finish_reason is not None:
                    ms[ev.index] = ev.metrics
                    last = handle.done and not include_usage
                    yield chunk(
                        [
                            ChatChunkChoice(
                                index=ev.index, delta=Delta(), finish_reason=ev.finish_reason
                            )
                        ],
                        speculative=speculative_info(ms, llm.method) if last else None,
                    )
            metrics.count("success")
            if include_usage:
                yield chunk(
                    [],
                    usage=_usage(handle, prompt_tokens),
                    speculative=speculative_info(ms, llm.method),
                )
            yield "data: [DONE]\n\n"

        return stream(gen(), handle)

    return app


# -- specdec serve -----------------------------------------------------------------------------
def add_serve_args(p: argparse.ArgumentParser) -> None:
    from specdec.cli import _add_engine_args

    _add_engine_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--api-key",
        default=os.environ.get("SPECDEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $SPECDEC_API_KEY; none: open)",
    )
    g.add_argument("--max-num-seqs", type=int, default=16, help="requests decoded together")
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="tokens per request, prompt included (default: the model's context, capped so "
        "the KV cache of --max-num-seqs rows fits a quarter of RAM)",
    )
    g.add_argument(
        "--max-waiting", type=int, default=64, help="queued requests beyond the batch (then 429)"
    )
    g.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _fit_model_len(llm, max_num_seqs: int) -> int:
    """The longest context whose cache for ``max_num_seqs`` rows fits the KV budget."""
    import psutil

    from specdec.llm import DEFAULT_KV_BUDGET

    budget = int(psutil.virtual_memory().total * DEFAULT_KV_BUDGET)
    per_row = budget // max(1, max_num_seqs * llm.decoder.bytes_per_token())
    return min(llm.max_model_len, per_row - llm.decoder.cache_slack)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.cli import llm_from_args

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(message)s"
    )
    if args.max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs must be >= 1, got {args.max_num_seqs}")
    llm = llm_from_args(args, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs)
    if args.max_model_len is None:
        fit = _fit_model_len(llm, args.max_num_seqs)
        if fit < 64:
            raise ValueError(
                f"the KV cache for {args.max_num_seqs} requests does not fit in memory: "
                "lower --max-num-seqs or set --max-model-len"
            )
        if fit < llm.max_model_len:
            log.warning(
                "max_model_len capped at %d tokens so %d cache rows fit in RAM "
                "(set --max-model-len to choose)",
                fit,
                args.max_num_seqs,
            )
            llm.max_model_len = fit
    app = create_app(
        llm,
        args.model,
        api_key=args.api_key,
        max_num_seqs=args.max_num_seqs,
        max_model_len=llm.max_model_len,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
    )
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log.warning(
            "listening on %s without an API key: anyone who can reach it may use it",
            args.host,
        )
    print(f"specdec serve: http://{args.host}:{args.port}/v1 (model '{args.model}')", flush=True)
    uvicorn.run(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
    )
    llm.close()
    return 0
