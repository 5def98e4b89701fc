"""The target's side of the worker process: the one place that starts, watches, restarts and
stops it. Everything else only calls ``request``/``notify`` and learns of failures as
``ChannelError``, after which the handle is down and restarting in the background."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import subprocess
import sys
import threading
import time

from specdec.ssd.channel import Channel, ChannelError
from specdec.ssd.protocol import Message, Ready, StartFailed, Stop, WorkerConfig

log = logging.getLogger("specdec.ssd")


class WorkerHandle:
    def __init__(
        self, config: WorkerConfig, reply_timeout_s: float = 30.0, start_timeout_s: float = 180.0
    ):
        self.config = config
        self.reply_timeout_s = reply_timeout_s
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.channel: Channel | None = None
        self.generation = 0  # bumps at every (re)start: drafters resync their sequences
        self.failures: list[str] = []
        self.restarts = 0
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None
        self._closed = False
        atexit.register(self.stop)

    # -- life cycle --------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self.channel is not None

    def start(self, wait: bool = True) -> None:
        """Start the worker; with ``wait`` block until it is connected (or raise)."""
        if wait:
            self._start()
            return
        with self._lock:
            if self._starting is not None or self._closed:
                return
            self._starting = threading.Thread(target=self._start_quietly, daemon=True)
            self._starting.start()

    def _start_quietly(self) -> None:
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - a failed restart leaves us on the fallback
            log.warning("SSD drafter restart failed: %s", exc)
        finally:
            with self._lock:
                self._starting = None

    def _start(self) -> None:
        rendezvous = Channel.listen(self.config.host)
        cfg = dataclasses.replace(
            self.config, port=rendezvous.port, key=rendezvous.key, parent_pid=os.getpid()
        )
        command = [sys.executable, "-m", "specdec.ssd.worker"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        proc.stdin.write(cfg.to_json().encode())  # the key too: not on the command line
        proc.stdin.close()
        self.proc = proc
        t0 = time.perf_counter()
        try:
            channel = self._connect(rendezvous, proc, t0 + self.start_timeout_s)
            ready = channel.recv(self.start_timeout_s)  # the worker loads its model first
        except ChannelError as exc:
            self._kill(proc)
            raise ChannelError(f"the SSD drafter did not start: {exc}") from None
        finally:
            rendezvous.close()
        if not isinstance(ready, Ready):
            self._kill(proc)
            why = ready.message if isinstance(ready, StartFailed) else f"it sent {ready.op!r}"
            raise ChannelError(f"the SSD drafter did not start: {why}")
        with self._lock:
            if self._closed:
                self._kill(proc)
                return
            self.channel = channel
            self.generation += 1
        log.info("SSD drafter up (pid %d) after %.1f s", proc.pid, time.perf_counter() - t0)

    def _connect(self, rendezvous, proc: subprocess.Popen, deadline: float) -> Channel:
        """The worker's connection, giving up as soon as it exits or the deadline passes."""
        while True:
            try:
                return rendezvous.accept(0.1, self.reply_timeout_s)
            except ChannelError:
                if proc.poll() is not None:
                    raise ChannelError(f"the worker exited with code {proc.returncode}") from None
                if time.perf_counter() > deadline:
                    raise ChannelError("timed out waiting for the worker to connect") from None

    def fail(self, reason: str) -> None:
        """The worker died or stopped answering: kill it, restart it in the background."""
        with self._lock:
            channel, self.channel = self.channel, None
            proc, self.proc = self.proc, None
        if channel is not None:
            channel.close()
        self.failures.append(reason)
        log.warning("SSD drafter lost (%s): continuing on the target alone, restarting it", reason)
        if proc is not None:
            self._kill(proc)
        if not self._closed:
            self.restarts += 1
            self.start(wait=False)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            channel, self.channel = self.channel, None
            proc, self.proc = self.proc, None
            starting = self._starting
        if channel is not None:
            with contextlib.suppress(ChannelError):
                channel.send(Stop())
            channel.close()
        if proc is not None:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill(proc)
        if starting is not None:
            starting.join(timeout=self.start_timeout_s)
            with self._lock:
                proc, self.proc = self.proc, None
            if proc is not None:
                self._kill(proc)

    # -- messages ----------------------------------------------------------------------------
    def notify(self, msg: Message) -> None:
        """Send without waiting for a reply."""
        channel = self.channel
        if channel is None:
            raise ChannelError("the SSD drafter is not running")
        try:
            channel.send(msg)
        except ChannelError as exc:
            self.fail(str(exc))
            raise

    def request(self, msg: Message) -> Message:
        """Send and wait for the reply (at most reply_timeout_s)."""
        self.notify(msg)
        try:
            return self.channel.recv()
        except (ChannelError, AttributeError) as exc:
            self.fail(f"no reply to {msg.op!r}: {exc}")
            raise ChannelError(str(exc)) from exc

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return None if proc is None else proc.pid
