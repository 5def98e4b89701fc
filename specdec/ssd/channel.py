"""Messages between the target's process and the drafter's, over torch.distributed (gloo).

Each process holds its own standalone gloo process group (TCPStore rendezvous on loopback or
another host), so several engines can live in one process and a failed peer is dropped by
dropping the group. A message (``protocol.py``) travels as its pickled wire form (small: token
lists and sparse probabilities), a length header and a byte tensor. Every receive has a
timeout, and a closed or silent peer raises ChannelError instead of hanging.
"""

from __future__ import annotations

import pickle
import queue
import threading
from datetime import timedelta

import torch
from torch.distributed import ProcessGroupGloo, TCPStore

from specdec.ssd.protocol import Message


class ChannelError(RuntimeError):
    """The peer died, closed the connection, or did not answer in time."""


IDLE_FOREVER = timedelta(days=365)  # gloo closes a pair whose wait times out: never for idling


class Channel:
    def __init__(self, store: TCPStore, rank: int, timeout_s: float | None):
        """timeout_s: how long one send or receive may take (None: wait indefinitely, for the
        worker idling between requests; it still wakes when the target goes away)."""
        self.rank = rank
        self.peer = 1 - rank
        self.timeout = IDLE_FOREVER if timeout_s is None else timedelta(seconds=timeout_s)
        try:
            self.group = ProcessGroupGloo(store, rank, 2, IDLE_FOREVER)
        except RuntimeError as exc:
            raise ChannelError(f"could not connect to the peer process: {exc}") from exc
        self.bytes_sent = 0

    @classmethod
    def listen(cls, timeout_s: float, host: str = "127.0.0.1") -> tuple[TCPStore, int]:
        """The target's side of the rendezvous: a store on a free port (the worker gets it)."""
        timeout = timedelta(seconds=timeout_s)
        store = TCPStore(host, 0, 2, True, timeout=timeout, wait_for_workers=False)
        return store, store.port

    @classmethod
    def connect(cls, host: str, port: int, connect_timeout_s: float) -> Channel:
        """The worker's side (its receives wait indefinitely)."""
        store = TCPStore(host, port, 2, False, timeout=timedelta(seconds=connect_timeout_s))
        return cls(store, 1, None)

    def send(self, msg: Message) -> None:
        data = pickle.dumps(msg.to_wire(), protocol=pickle.HIGHEST_PROTOCOL)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        header = torch.tensor([len(data)], dtype=torch.int64)
        try:
            self.group.send([header], self.peer, 0).wait(self.timeout)
            self.group.send([payload], self.peer, 1).wait(self.timeout)
        except RuntimeError as exc:
            raise ChannelError(f"send failed: {exc}") from exc
        self.bytes_sent += len(data)

    def recv(self, timeout_s: float | None = None) -> Message:
        timeout = self.timeout if timeout_s is None else timedelta(seconds=timeout_s)
        header = torch.zeros(1, dtype=torch.int64)
        try:
            self.group.recv([header], self.peer, 0).wait(timeout)
            payload = torch.empty(int(header[0]), dtype=torch.uint8)
            self.group.recv([payload], self.peer, 1).wait(timeout)
        except RuntimeError as exc:
            raise ChannelError(f"receive failed: {exc}") from exc
        return Message.from_wire(pickle.loads(payload.numpy().tobytes()))


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
