"""AsyncEngine: the engine loop in one background thread, and a per-request asyncio queue.

The thread calls ``engine.step()`` while there is work and sleeps on an Event when there is
none. After every step it hands each touched sequence's new text (and, once it finishes, its
finish reason and metrics) to the queue of the HTTP request that owns it, through
``loop.call_soon_threadsafe``. Requests join with ``engine.add`` (thread-safe), so new
requests enter the running batch between rounds (continuous batching) and the event loop
never runs model work.

If ``step`` raises, the thread logs the traceback, fails every in-flight request and stops;
``alive`` turns False (``/health`` answers 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from specdec.logprobs import TokenLogprob
from specdec.metrics import RequestMetrics
from specdec.sequence import Sequence

log = logging.getLogger("specdec.server")


class QueueFull(Exception):
    """More requests than the running batch plus the waiting queue may hold."""


class EngineDead(Exception):
    """The engine thread is not running (it failed or the server is shutting down)."""


@dataclass
class Event:
    """One piece of one sequence's output, handed from the engine thread to a request."""

    index: int  # choice index within the HTTP request
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens since the last
    finish_reason: str | None = None  # set on the sequence's last event
    metrics: RequestMetrics | None = None  # on the last event
    error: str | None = None  # the engine failed: the request ends with a 500


@dataclass
class RequestHandle:
    """The sequences of one HTTP request (n choices share one queue)."""

    seqs: list[Sequence]
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float = field(default_factory=time.perf_counter)
    open: set[int] = field(default_factory=set)  # choice indices not finished yet
    aborted: bool = False
    checked: float = 0.0  # event-loop time of the last disconnect check

    @property
    def done(self) -> bool:
        return not self.open

    def note(self, ev: Event) -> None:
        """Call on the event loop for every event taken from ``queue``."""
        if ev.finish_reason is not None or ev.error is not None:
            self.open.discard(ev.index)
        if ev.error is not None:
            self.open.clear()


class AsyncEngine:
    def __init__(
        self,
        llm,
        max_num_seqs: int = 16,
        max_model_len: int | None = None,
        max_waiting: int = 64,
        on_finished=None,
    ):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.llm = llm
        self.engine = llm.engine
        self.method = llm.method
        self.max_num_seqs = max_num_seqs
        self.max_model_len = min(max_model_len or llm.max_model_len, llm.max_model_len)
        self.max_waiting = max_waiting
        self.on_finished = on_finished  # called in the engine thread with each seq's metrics
        self._owners: dict[str, tuple[RequestHandle, int]] = {}  # request_id -> (handle, index)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.steps = 0  # engine steps run
        self.busy_s = 0.0  # seconds spent in engine.step

    # -- lifetime ----------------------------------------------------------------------------
    def start(self) -> None:
        """Reserve the caches for ``max_num_seqs`` rows of ``max_model_len`` and start."""
        if self._thread is not None:
            return
        self.llm.reserve(self.max_num_seqs, self.max_model_len)
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_all("the server is shutting down")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # -- counts ------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return self.engine.num_running

    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    @property
    def num_in_flight(self) -> int:
        """Sequences handed to the engine and not finished or aborted."""
        return len(self._owners)

    @property
    def capacity(self) -> int:
        return self.max_num_seqs + self.max_waiting

    # -- requests (event loop) ---------------------------------------------------------------
    def submit(self, seqs: list[Sequence]) -> RequestHandle:
        """Hand the sequences of one request to the engine; their events arrive, in order
        per sequence, on the returned handle's queue. Call from the event loop."""
        loop = asyncio.get_running_loop()
        handle = RequestHandle(
            seqs=seqs,
            queue=asyncio.Queue(),
            loop=loop,
            open=set(range(len(seqs))),
            checked=loop.time(),
        )
        with self._lock:
            if not self.alive:
                raise EngineDead("the engine is not running")
            if len(self._owners) + len(seqs) > self.capacity:
                raise QueueFull(
                    f"the server is at capacity ({self.max_num_seqs} running and "
                    f"{self.max_waiting} waiting requests); the waiting queue is full, "
                    "retry later"
                )
            for i, s in enumerate(seqs):
                self._owners[s.request_id] = (handle, i)
        for s in seqs:
            self.engine.add(s)
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle) -> int:
        """Cancel a request's unfinished sequences (their cache rows are freed on the next
        step). Returns how many were still in flight."""
        n = 0
        with self._lock:
            for s in handle.seqs:
                if self._owners.pop(s.request_id, None) is not None:
                    n += 1
                    self.engine.abort(s.request_id)
        handle.aborted = True
        handle.open.clear()
        if n:
            self._wake.set()
        return n

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self._wake.clear()
                if self._stopping:
                    return
                if not self.engine.has_work():
                    self._wake.wait()
                    continue
                t0 = time.perf_counter()
                touched = self.engine.step()
                self.steps += 1
                self.busy_s += time.perf_counter() - t0
                self._deliver(touched)
        except BaseException as exc:  # noqa: BLE001 - any failure stops the engine
            self.error = exc
            log.exception("the engine thread failed; failing all in-flight requests")
            self._fail_all(f"the engine failed: {type(exc).__name__}: {exc}")

    def _deliver(self, touched: list[Sequence]) -> None:
        """Hand each touched sequence's news to its request: one wake-up of each event loop
        per step, however many sequences moved."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, Event]]] = {}
        for seq in touched:
            owner = self._owners.get(seq.request_id)
            if owner is None:  # aborted meanwhile
                continue
            handle, index = owner
            text = seq.take_new_text()
            lps = seq.take_new_logprobs()
            if seq.finished:
                with self._lock:
                    if self._owners.pop(seq.request_id, None) is None:
                        continue
                m = RequestMetrics.from_sequence(seq, self.method)
                if self.on_finished is not None:
                    try:
                        self.on_finished(m)
                    except Exception:  # noqa: BLE001 - metrics must not kill the engine
                        log.exception("recording metrics failed")
                ev = Event(index, text, lps, seq.finish_reason, m)
            elif text or lps:
                ev = Event(index, text, lps)
            else:
                continue
            batches.setdefault(handle.loop, []).append((handle, ev))
        for loop, items in batches.items():
            self._post(loop, items)

    @staticmethod
    def _post(loop: asyncio.AbstractEventLoop, items: list[tuple[RequestHandle, Event]]) -> None:
        with contextlib.suppress(RuntimeError):  # a closed event loop: nobody is listening
            loop.call_soon_threadsafe(_dispatch, items)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            owners, self._owners = self._owners, {}
        for handle, index in owners.values():
            self._post(handle.loop, [(handle, Event(index, error=message))])


def _dispatch(items: list[tuple[RequestHandle, Event]]) -> None:
    """On the event loop: put each event on its request's queue."""
    for handle, ev in items:
        handle.queue.put_nowait(ev)
