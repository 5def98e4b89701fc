"""The deadline for a request's headers, on the HTTP connection.

uvicorn waits for a request's headers as long as the client keeps the connection open: its
keep-alive timeout only runs between requests and stops at the next request's first byte. So a
client that sends its headers a byte a second holds a connection (and a file descriptor) for
good, and a few thousand such clients hold the server. The app cannot help: it is called only
once the headers are complete.

``http_protocol(header_timeout_s)`` is uvicorn's own HTTP protocol (httptools or h11, as
uvicorn picks it) with one timer: armed when a connection opens and when the first byte of a
next request arrives, disarmed when the request's headers are complete. When it fires the
connection is closed, after a 408 answer if part of a request had arrived. The body has its
own deadline in the guard (``guard``), where the body is read.
"""

from __future__ import annotations

import asyncio
import json
import logging

from specdec.server.protocol import error_body

log = logging.getLogger("specdec.server")

DEFAULT_HEADER_TIMEOUT_S = 30.0


def http_protocol(header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class with the header deadline: pass it as ``http=``."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s!r}")
    return type(
        "HeaderDeadlineProtocol",
        (_HeaderDeadline, AutoHTTPProtocol),
        {"header_timeout_s": float(header_timeout_s)},
    )


def _timeout_answer(header_timeout_s: float) -> bytes:
    body = json.dumps(
        error_body(
            f"the request headers did not arrive within {header_timeout_s:g} s",
            code="request_timeout",
        )
    ).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class _HeaderDeadline:
    """Mixed in before uvicorn's protocol. It reads two things both of uvicorn's protocols
    keep: ``cycle``, the current request (set once its headers are parsed), and
    ``cycle.response_complete``."""

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    _timer: asyncio.TimerHandle | None = None
    _waited_for = None  # the request cycle current when the timer was armed
    _partial = False  # bytes of a request arrived while the timer ran

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first byte of the next request
        if self._timer is not None:
            self._partial = True
        super().data_received(data)
        if self._timer is not None and self.cycle is not self._waited_for:
            self._disarm()  # a new request: its headers are complete

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._waited_for = self.cycle
        self._partial = False
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        log.info(
            "closed a connection from %s: no complete request headers within %g s",
            self.client,
            self.header_timeout_s,
        )
        if self._partial:
            self.transport.write(_timeout_answer(self.header_timeout_s))
        self.transport.close()
