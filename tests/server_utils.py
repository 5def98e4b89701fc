"""Run a real uvicorn server for an app in a background thread, on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class ServerThread:
    """``config``: more of uvicorn.Config's options (e.g. ``http=http_protocol(1.0)``)."""

    def __init__(self, app, startup_timeout: float = 30.0, **config):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config.setdefault("log_level", "warning")
        config.setdefault("timeout_graceful_shutdown", 2)
        self.server = uvicorn.Server(uvicorn.Config(app, **config))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.startup_timeout = startup_timeout

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
