"""Engine: the scheduler. Requests wait, join the running batch between rounds (continuous
batching), take part in one decoding round per step, and leave when they finish.

The engine knows nothing of how a round works; that is the decoder's job (AR, SD, SSD).
``add`` and ``abort`` may be called from any thread; ``step`` from one thread only.
"""

from __future__ import annotations

import threading
from collections import deque

from specdec.decoders.base import Decoder
from specdec.sequence import Sequence, Status


class Engine:
    def __init__(self, decoder: Decoder, max_prefill_tokens: int = 4096):
        self.decoder = decoder
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._lock = threading.Lock()
        self._aborted: set[str] = set()

    # -- requests ----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        with self._lock:
            self.waiting.append(seq)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Admit, prefill, run one round. Returns the sequences that made progress (new
        tokens or finished), finished ones already removed from the batch."""
        self._apply_aborts()
        admitted, scored_only = self._admit()
        touched: list[Sequence] = list(scored_only)
        scoring = [s for s in admitted + scored_only if s.params.prompt_logprobs is not None]
        if scoring:
            self.decoder.score_prompts(scoring)
        for s in scored_only:
            s.finish_without_output()
        if admitted:
            self.decoder.prefill(admitted)
            self.running.extend(admitted)
            touched.extend(admitted)
        new = {id(s) for s in admitted}
        active = [s for s in self.running if not s.finished and id(s) not in new]
        if active:
            self.decoder.round(active)
            touched.extend(active)
        self._retire()
        return touched

    def _admit(self) -> tuple[list[Sequence], list[Sequence]]:
        """The waiting requests that join the batch now, and those that asked for no tokens
        (max_tokens=0: their prompts are only scored; they never take a cache row)."""
        admitted: list[Sequence] = []
        scored_only: list[Sequence] = []
        budget = self.max_prefill_tokens
        with self._lock:
            while self.waiting:
                seq = self.waiting[0]
                if (admitted or scored_only) and len(seq.prompt_ids) > budget:
                    break  # prefill it next step rather than in one huge padded batch
                if seq.params.max_tokens == 0:
                    self.waiting.popleft()
                    scored_only.append(seq)
                    budget -= len(seq.prompt_ids)
                    continue
                if self.decoder.free_rows() <= 0:
                    break
                self.waiting.popleft()
                self.decoder.allocate(seq)
                seq.status = Status.RUNNING
                budget -= len(seq.prompt_ids)
                admitted.append(seq)
        return admitted, scored_only

    def _apply_aborts(self) -> None:
        with self._lock:
            if not self._aborted:
                return
            ids, self._aborted = self._aborted, set()
            for seq in [s for s in self.waiting if s.request_id in ids]:
                self.waiting.remove(seq)
                seq.abort()
        for seq in self.running:
            if seq.request_id in ids:
                seq.abort()
        self._retire()

    def _retire(self) -> None:
        still = []
        for seq in self.running:
            if seq.finished:
                self.decoder.release(seq)
            else:
                still.append(seq)
        self.running = still
