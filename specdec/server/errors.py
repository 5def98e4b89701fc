"""The API's failures: OpenAI's error body for each, and the app's exception handlers.

Every failed generation request is counted once in ``specdec_requests_total``: 429 as
``rejected``, 5xx as ``error``, any other 4xx as ``invalid``. Every error body has a ``code``.
An unexpected exception is logged once and answered with a 500 on a connection that stays
usable (``CatchAll``).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.server.protocol import error_body

log = logging.getLogger("specdec.server")

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class APIError(Exception):
    """A request the server answers with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        # every answer names its kind: a 400 without a more specific code is a bad value
        self.code = code or ("invalid_value" if status == 400 else None)
        self.headers = headers


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, **kw
) -> JSONResponse:
    """OpenAI's error body. The message may quote the request's text, which need not be valid
    Unicode (a lone surrogate): such characters are sent escaped, as ``\\ud800``."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse(error_body(message, **kw), status_code=status, headers=headers)


def count_error(request: Request, status: int) -> None:
    if request.url.path in GENERATION_PATHS:
        metrics = request.app.state.metrics
        if status == 429:
            metrics.count("rejected")
        elif status >= 500:
            metrics.count("error")
        else:
            metrics.count("invalid")


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One readable line for pydantic's errors (at most five fields), and the first field.
    A union's failed alternatives collapse into "is not valid (expected one of: ...)"."""
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
    return "invalid request: " + "; ".join(parts), param


# -- handlers ----------------------------------------------------------------------------------
async def _api_error(request: Request, exc: APIError) -> Response:
    count_error(request, exc.status)
    return error_response(
        exc.status,
        exc.message,
        headers=exc.headers,
        type=exc.type,
        param=exc.param,
        code=exc.code,
    )


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    count_error(request, 400)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "malformed JSON in the request body", code="invalid_json")
    msg, param = validation_message(errors)
    return error_response(400, msg, param=param, code="invalid_value")


async def _client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request"; nobody reads it


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers, code=code)


def _unhandled(request: Request, exc: Exception) -> Response:
    log.error("unhandled error in %s", request.url.path, exc_info=exc)
    count_error(request, 500)
    msg = f"internal error: {type(exc).__name__}: {exc}"
    return error_response(500, msg, type="server_error", code="internal_error")


class CatchAll:
    """Pure ASGI, around the app: an unexpected exception is logged once and answered with a
    500, and the connection stays usable. (Starlette's handler for ``Exception`` answers too,
    but re-raises, so that the server logs the traceback a second time and drops the client's
    keep-alive connection.) Once an answer has started only closing the connection can end it:
    then the exception goes on to the server."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:  # noqa: BLE001 - the last resort for what nobody handled
            if started:
                raise
            await _unhandled(Request(scope), exc)(scope, receive, send)


def add_exception_handlers(app: FastAPI) -> None:
    """The API's handlers, and ``CatchAll`` around everything (add it after the middleware)."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(ClientGone, _client_gone)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(CatchAll)
