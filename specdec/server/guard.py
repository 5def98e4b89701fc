"""The guard in front of the app: the API key and the request body's size.

A pure ASGI middleware, so that a request it refuses never reaches FastAPI: a wrong or
missing key gets 401 (every path but ``/health``), a body over the limit gets 413.
"""

from __future__ import annotations

import hmac

from specdec.server.errors import GENERATION_PATHS, error_response

DEFAULT_MAX_BODY_BYTES = 1 << 20


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
            if not self._authorized(auth):
                await self._drain(receive, headers)
                msg = (
                    "Incorrect API key provided."
                    if auth
                    else "Missing API key: send the header 'Authorization: Bearer KEY'."
                )
                resp = error_response(401, msg, param=None, code="invalid_api_key")
                return await resp(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        body, too_big, gone = await self._read(receive, headers)
        if gone:
            return
        if too_big:
            if self.on_reject is not None and path in GENERATION_PATHS:
                self.on_reject("invalid")
            resp = error_response(
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

    def _authorized(self, auth: str) -> bool:
        scheme, _, token = auth.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        )

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
