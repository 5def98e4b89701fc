"""Messages between the target's process and the drafter's, over one TCP connection.

The target listens on a free port (loopback, or an address another host can reach) and gives
the worker a random key with its config; the worker connects and sends the key first, and the
target drops any connection that does not (nothing it sends is unpickled). A message
(``protocol.py``) travels as its pickled wire form (small: token lists and sparse
probabilities) behind an 8-byte length. Nagle's algorithm is off: a round sends two messages
back to back before it reads a reply. Every receive has a timeout, and a closed or silent peer
raises ChannelError instead of hanging.

(The first transport was a gloo process group of torch.distributed: a round trip took 0.9 ms
when busy and 3.8 ms after a pause, median, where this takes 0.2-0.35 ms, and SSD pays one
in every round.)
"""

from __future__ import annotations

import hmac
import pickle
import queue
import secrets
import socket
import struct
import threading
import time

from specdec.ssd.protocol import Message

_LENGTH = struct.Struct("<Q")
KEY_BYTES = 32
KEY_WAIT_S = 5.0  # for the key once connected (the worker sends it at once)


class ChannelError(RuntimeError):
    """The peer died, closed the connection, or did not answer in time."""


def _socket_error(what: str, exc: BaseException) -> ChannelError:
    if isinstance(exc, socket.timeout):
        return ChannelError(f"{what} timed out")
    return ChannelError(f"{what} failed: {exc}")


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ChannelError("receive failed: the peer closed the connection")
        got += k
    return bytes(buf)


class Channel:
    def __init__(self, sock: socket.socket, timeout_s: float | None):
        """timeout_s: how long one send or receive may take by default (None: wait
        indefinitely, for the worker idling between requests; it still wakes when the target
        goes away, as the connection closes)."""
        self.sock = sock
        self.timeout = self._timeout_now = timeout_s
        sock.settimeout(timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.bytes_sent = 0

    def _set_timeout(self, timeout_s: float | None) -> None:
        # the worker never changes it: its receiving thread and its replies share the socket
        if timeout_s != self._timeout_now:
            self.sock.settimeout(timeout_s)
            self._timeout_now = timeout_s

    @classmethod
    def listen(cls, host: str = "127.0.0.1") -> Rendezvous:
        """The target's side: a socket on a free port, and the key the worker must send."""
        return Rendezvous(host)

    @classmethod
    def connect(cls, host: str, port: int, key: str, connect_timeout_s: float) -> Channel:
        """The worker's side (its receives wait indefinitely)."""
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout_s)
            sock.sendall(bytes.fromhex(key))
        except OSError as exc:
            raise _socket_error("connecting to the target", exc) from exc
        return cls(sock, None)

    def send(self, msg: Message) -> None:
        data = pickle.dumps(msg.to_wire(), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._set_timeout(self.timeout)
            self.sock.sendall(_LENGTH.pack(len(data)) + data)
        except OSError as exc:
            raise _socket_error("send", exc) from exc
        self.bytes_sent += len(data)

    def recv(self, timeout_s: float | None = None) -> Message:
        try:
            self._set_timeout(self.timeout if timeout_s is None else timeout_s)
            (n,) = _LENGTH.unpack(_read_exactly(self.sock, _LENGTH.size))
            payload = _read_exactly(self.sock, n)
        except OSError as exc:
            raise _socket_error("receive", exc) from exc
        return Message.from_wire(pickle.loads(payload))

    def close(self) -> None:
        self.sock.close()


class Rendezvous:
    """A listening socket (``port``) that takes the one worker holding ``key``."""

    def __init__(self, host: str):
        try:
            self.sock = socket.create_server((host, 0))
        except OSError as exc:
            raise _socket_error(f"listening on {host}", exc) from exc
        self.port = self.sock.getsockname()[1]
        self.key = secrets.token_hex(KEY_BYTES)

    def accept(self, timeout_s: float, reply_timeout_s: float) -> Channel:
        """The worker's connection, once it has sent the key (raises ChannelError when none
        comes in timeout_s; a stranger's connection is closed and the wait goes on)."""
        deadline = time.monotonic() + timeout_s
        want = bytes.fromhex(self.key)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelError("timed out waiting for the worker to connect")
            try:
                self.sock.settimeout(left)
                sock, _ = self.sock.accept()
            except OSError as exc:
                raise _socket_error("waiting for the worker", exc) from exc
            try:
                sock.settimeout(KEY_WAIT_S)
                got = _read_exactly(sock, KEY_BYTES)
            except (OSError, ChannelError):
                got = b""
            if hmac.compare_digest(got, want):
                return Channel(sock, reply_timeout_s)
            sock.close()

    def close(self) -> None:
        self.sock.close()


class Inbox:
    """The worker's receiving side: a thread takes each message off the channel as soon as it
    arrives, so that the worker can ask, between two passes of its drafting, whether the
    target has sent something (``arrived``: the round's outcome, which makes the rest of the
    tree useless) without blocking. A broken channel reaches ``get`` as ChannelError."""

    def __init__(self, channel: Channel, stop_type: type):
        self._messages: queue.Queue = queue.Queue()
        self._stop_type = stop_type
        threading.Thread(target=self._receive, args=(channel,), daemon=True).start()

    def _receive(self, channel: Channel) -> None:
        while True:
            try:
                msg = channel.recv()
            except ChannelError as exc:
                self._messages.put(exc)
                return
            self._messages.put(msg)
            if isinstance(msg, self._stop_type):
                return

    def arrived(self) -> bool:
        return not self._messages.empty()

    def get(self) -> Message:
        item = self._messages.get()
        if isinstance(item, ChannelError):
            raise item
        return item
