"""What the target's process and the drafter's say to each other: the worker's configuration
and every message, one dataclass each. The channel carries a message's wire form, a plain dict
(its type's ``op`` and its fields; nested items as dicts) that pickles without this module.

The target sends, and the worker answers only where a reply is shown:

  Prefill   cache new sequences (all their tokens but the pending one)
  Round     while the target verifies: the trunk [b_prev, d_1..d_K] of each sequence; the
            worker runs it, picks candidates, and drafts every branch ``depth`` tokens
  Outcome   what verification decided (``accepted`` drafts, then ``token``)  -> Drafts: the
            speculation cached for it (a hit) or, with ``backup``, one drafted just in time
  Draft     speculations drafted just in time (new sequences, after a fallback)  -> Drafts
  Release   forget sequences
  Resize    a cache for more or longer sequences (only when none is held)  -> Resized
  Stop      exit

At start-up the worker sends Ready, or StartFailed when it cannot load its model. Every reply
carries ``busy_s``, the worker's total time spent handling messages so far.

A sequence's ``start`` is how many of its tokens the target believes the worker holds; its
``catch_up`` the tokens after those that the worker has not seen yet.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import ClassVar

from specdec.sampling import SamplingParams
from specdec.ssd.cache import Speculation


@dataclass
class WorkerConfig:
    draft_path: str
    dtype: str
    device: str
    quantization: str | None
    head_ids: list[int] | None
    tokenizer_vocab: int
    target_vocab: int
    max_rows: int
    max_len: int  # longest sequence
    k: int  # speculation length K (the deepest a speculation is ever drafted)
    budget: int  # B: branches per sequence per round
    saguaro_c: float  # top-F draft probabilities are scaled by C (Saguaro sampling)
    sparse_q: int  # q' is kept on its top-N tokens (it is then the exact proposal)
    cpu_cores: list[int] | None
    num_threads: int | None
    host: str
    port: int
    key: str = ""  # what the worker sends first on connecting (``channel.py``)
    connect_timeout_s: float = 120.0
    parent_pid: int = 0
    # the target's tokenizer folder and EOS ids: a grammar constraint masks the worker's q too
    tokenizer_path: str | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        return cls(**json.loads(text))


class Message:
    """A message type: ``op`` names it on the wire; ``item_types`` names its list fields whose
    entries are dataclasses (sent as dicts; None entries stay None)."""

    op: ClassVar[str]
    item_types: ClassVar[dict[str, type]] = {}

    def to_wire(self) -> dict:
        wire = {"op": self.op}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self.item_types:
                value = [None if v is None else _as_dict(v) for v in value]
            wire[f.name] = value
        return wire

    @staticmethod
    def from_wire(wire: dict) -> Message:
        kind = MESSAGES.get(wire.get("op"))
        if kind is None:
            raise ValueError(f"unknown SSD message {wire.get('op')!r}")
        args = {name: value for name, value in wire.items() if name != "op"}
        for name, item in kind.item_types.items():
            args[name] = [None if v is None else item(**v) for v in args[name]]
        return kind(**args)


def _as_dict(item) -> dict:
    return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}


# -- the target's messages -----------------------------------------------------------------------
@dataclass
class PrefillSeq:
    sid: str
    tokens: list[int]  # all but the pending token
    temperature: float
    top_k: int
    top_p: float
    seed: int  # the request's seed: the worker derives its own random stream from it
    fanout: list[int] = field(default_factory=list)  # until the first round sends one
    coupled: bool = False  # draft with the request's position-keyed noise (coupling.py)
    prompt_len: int = 0  # how many of ``tokens`` are the prompt (the rest is output)
    # the request's logits-processor fields (processors.PROCESSOR_FIELDS that are set): the
    # worker builds the same processors for its q as the target uses for its p
    processing: dict = field(default_factory=dict)

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, **self.processing
        )


@dataclass
class Prefill(Message):
    op: ClassVar[str] = "prefill"
    item_types: ClassVar[dict[str, type]] = {"seqs": PrefillSeq}
    seqs: list[PrefillSeq]


@dataclass
class RoundSeq:
    sid: str
    start: int
    catch_up: list[int]  # tokens emitted in rounds without drafts, before b_prev
    trunk: list[int]  # [b_prev, d_1..d_K]: the pending token and the drafts being verified
    fanout: list[int]  # candidates to prepare after each number of accepted drafts


@dataclass
class Round(Message):
    op: ClassVar[str] = "round"
    item_types: ClassVar[dict[str, type]] = {"seqs": RoundSeq}
    depth: int  # tokens per speculation: the target's current K
    seqs: list[RoundSeq]


@dataclass
class OutcomeSeq:
    sid: str
    accepted: int  # drafts the target accepted
    token: int  # the token it emitted after them (now pending)


@dataclass
class Outcome(Message):
    op: ClassVar[str] = "outcome"
    item_types: ClassVar[dict[str, type]] = {"seqs": OutcomeSeq}
    depth: int
    backup: bool  # draft just in time on a miss (else a miss returns None)
    seqs: list[OutcomeSeq]


@dataclass
class DraftSeq:
    sid: str
    start: int
    catch_up: list[int]  # ends with the pending token


@dataclass
class Draft(Message):
    op: ClassVar[str] = "draft"
    item_types: ClassVar[dict[str, type]] = {"seqs": DraftSeq}
    depth: int
    seqs: list[DraftSeq]


@dataclass
class Release(Message):
    op: ClassVar[str] = "release"
    sids: list[str]


@dataclass
class Resize(Message):
    op: ClassVar[str] = "resize"
    rows: int
    max_len: int


@dataclass
class Stop(Message):
    op: ClassVar[str] = "stop"


# -- the worker's messages -----------------------------------------------------------------------
@dataclass
class Ready(Message):
    op: ClassVar[str] = "ready"


@dataclass
class StartFailed(Message):
    op: ClassVar[str] = "start_failed"
    message: str


@dataclass
class Drafts(Message):
    """The reply to Outcome and Draft: one speculation per sequence (None: a miss without
    backup) and whether each came from the cache."""

    op: ClassVar[str] = "drafts"
    item_types: ClassVar[dict[str, type]] = {"specs": Speculation}
    specs: list[Speculation | None]
    hits: list[bool]
    busy_s: float = 0.0


@dataclass
class Resized(Message):
    op: ClassVar[str] = "resized"
    busy_s: float = 0.0


TARGET_MESSAGES = (Prefill, Round, Outcome, Draft, Release, Resize, Stop)
WORKER_MESSAGES = (Ready, StartFailed, Drafts, Resized)
MESSAGES: dict[str, type[Message]] = {kind.op: kind for kind in TARGET_MESSAGES + WORKER_MESSAGES}
