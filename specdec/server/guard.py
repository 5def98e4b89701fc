"""The guard in front of the app: the API key, and the request body's size and deadline.

A pure ASGI middleware, so that a request it refuses never reaches FastAPI: a wrong or
missing key gets 401 (every path but ``/health``), a body over the limit gets 413, and a body
that has not fully arrived ``body_timeout_s`` after the headers gets 408 and the connection
closed (a client that sends its body a byte at a time must not hold a connection for good;
the headers have their own deadline, in ``connection``).
"""

from __future__ import annotations

import asyncio
import hmac

from specdec.server.errors import GENERATION_PATHS, error_response

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_BODY_TIMEOUT_S = 60.0  # 1 MiB in 60 s: a 140 kbit/s client still makes it
CLOSE = {"Connection": "close"}


class BodyTimeout(Exception):
    """The request body did not arrive in time."""


class GuardMiddleware:
    """Pure ASGI: checks ``Authorization: Bearer KEY`` (every path but /health) and caps the
    request body at ``max_body_bytes`` (413) and ``body_timeout_s`` (408), reading it once and
    replaying it to the app."""

    def __init__(
        self,
        app,
        api_key: str | None,
        max_body_bytes: int,
        on_reject=None,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ):
        self.app = app
        self.api_key = api_key
        self.max_body = max_body_bytes
        self.drain_cap = max(16 * max_body_bytes, 64 << 20)
        self.on_reject = on_reject
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope.get("path", "")
        if self.api_key and path != "/health":
            auth = headers.get("authorization", "")
            if not self._authorized(auth):
                drained = await self._drain(receive, headers)
                msg = (
                    "Incorrect API key provided."
                    if auth
                    else "Missing API key: send the header 'Authorization: Bearer KEY'."
                )
                # RFC 6750: the scheme, and for a key that was sent, why it was refused
                challenge = {
                    "WWW-Authenticate": 'Bearer error="invalid_token"' if auth else "Bearer"
                }
                resp = error_response(
                    401,
                    msg,
                    headers=challenge if drained else {**challenge, **CLOSE},
                    param=None,
                    code="invalid_api_key",
                )
                return await resp(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH") and not _declares_body(headers):
            return await self.app(scope, receive, send)
        try:
            body, too_big, gone = await self._read(receive, headers)
        except BodyTimeout:
            self._reject(path)
            resp = error_response(
                408,
                f"the request body did not arrive within {self.body_timeout_s:g} s",
                headers=CLOSE,
                code="request_timeout",
            )
            return await resp(scope, receive, send)
        if gone:
            return
        if too_big:
            self._reject(path)
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

    def _reject(self, path: str) -> None:
        if self.on_reject is not None and path in GENERATION_PATHS:
            self.on_reject("invalid")

    def _authorized(self, auth: str) -> bool:
        scheme, _, token = auth.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        )

    async def _read(self, receive, headers) -> tuple[bytes, bool, bool]:
        """The body (empty when over the limit), whether it was over, whether the client left;
        raises ``BodyTimeout`` past the deadline."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await self._read_all(receive, headers)
        except TimeoutError:
            raise BodyTimeout() from None

    async def _read_all(self, receive, headers) -> tuple[bytes, bool, bool]:
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

    async def _drain(self, receive, headers) -> bool:
        """Read and drop the body of a refused request, so that the connection can serve the
        next one; False when it did not arrive in time (then the connection must close)."""
        if not _declares_body(headers):
            return True
        try:
            await self._read(receive, headers)
        except BodyTimeout:
            return False
        return True


def _declares_body(headers: dict[str, str]) -> bool:
    return headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
