"""Sequence: one request's state while it is generated, and the rules for when it stops.

Every method hands tokens to ``Sequence.append`` one at a time, in order, so EOS, stop
tokens, stop strings and ``max_tokens`` behave identically whether a round yields one token
(AR) or many (speculative methods): the first stop wins and nothing after it is kept.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from specdec.metrics import DrafterStats
from specdec.processors import TokenVocabulary, build_processors
from specdec.sampling import SamplingParams, SequenceRNG
from specdec.tokenizer import Detokenizer, Tokenizer

_ids = itertools.count()


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SequenceStats:
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: float | None = None
    rounds: int = 0  # decoding rounds this sequence took part in (after the prefill)
    drafted: int = 0  # draft tokens proposed to the verifier
    accepted: int = 0  # draft tokens accepted
    judged: int = 0  # draft tokens the verifier got to judge: the accepted + the first rejected
    accepted_lengths: list[int] = field(default_factory=list)  # per round
    position_proposed: list[int] = field(default_factory=list)  # per draft position
    position_accepted: list[int] = field(default_factory=list)
    target_forwards: int = 0  # target passes this sequence was part of (prefill included)
    draft_time: float = 0.0  # seconds of the rounds it took part in, by phase
    verify_time: float = 0.0
    decode_time: float = 0.0  # whole rounds (draft + verify + bookkeeping)
    drafter: DrafterStats | None = None  # a drafter's own counters, with their metrics()

    def per_token_acceptance(self, prior: float = 0.0, prior_weight: float = 0.0) -> float:
        """alpha, the chance that the verifier accepts a draft token given it reaches it: the
        maximum-likelihood estimate accepted / judged (with an optional prior). Tokens after
        the first rejection are never judged; counting them (accepted / drafted, the usual
        "acceptance rate") underestimates alpha the more, the longer the drafts."""
        return (self.accepted + prior * prior_weight) / max(self.judged + prior_weight, 1e-9)


class Sequence:
    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer,
        eos_token_ids: list[int],
        request_id: str | None = None,
    ):
        self.request_id = request_id or f"req-{next(_ids)}"
        self.prompt_ids = list(prompt_ids)
        self.params = params
        # logits processors (penalties, ...): empty for most requests, which then cost nothing
        vocab = TokenVocabulary(tokenizer.vocab_size, tuple(eos_token_ids), tokenizer)
        self.processors = build_processors(params, self.prompt_ids, vocab)
        self.rng = SequenceRNG(params.seed)
        self.output_ids: list[int] = []
        self.text = ""  # full output text (stop strings cut off)
        self.emitted = 0  # how much of ``text`` has been handed to a stream
        self.finish_reason: str | None = None
        self.status = Status.WAITING
        self.row: int | None = None  # KV cache row while running
        self.stats = SequenceStats()
        self._detok = Detokenizer(tokenizer)
        self._eos = set() if params.ignore_eos else set(eos_token_ids)
        self._stop_ids = set(params.stop_token_ids or [])
        self._stops = params.stop_strings
        self._max_stop = max((len(s) for s in self._stops), default=0)

    # -- tokens ------------------------------------------------------------------------------
    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - len(self.output_ids)

    def append(self, token: int) -> bool:
        """Add one generated token; returns True once the sequence has finished."""
        if self.finished:
            return True
        if self.stats.first_token is None:
            self.stats.first_token = time.perf_counter()
        if token in self._eos or token in self._stop_ids:
            return self._finish("stop")  # the stopping token is not part of the output
        self.output_ids.append(token)
        before = len(self.text)
        self.text += self._detok.add(token)
        if self._stops and len(self.text) > before and self._cut_stop_string(before):
            return self._finish("stop")
        if len(self.output_ids) >= self.params.max_tokens:
            self.text += self._detok.flush()
            if self._stops and self._cut_stop_string(before):
                return self._finish("stop")
            return self._finish("length")
        return False

    def _cut_stop_string(self, before: int) -> bool:
        start = max(0, before - self._max_stop + 1)
        hits = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        return True

    def _finish(self, reason: str) -> bool:
        self.finish_reason = reason
        self.status = Status.FINISHED
        self.stats.finished = time.perf_counter()
        return True

    def abort(self, reason: str = "abort") -> None:
        if not self.finished:
            self._finish(reason)

    # -- streaming ---------------------------------------------------------------------------
    def take_new_text(self) -> str:
        """Text not yet streamed, holding back a tail that could still become a stop string."""
        end = len(self.text)
        if not self.finished and self._stops:
            end -= self._stop_prefix_overlap()
        piece = self.text[self.emitted : end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return piece

    def _stop_prefix_overlap(self) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
