"""Logits processors: deterministic changes of a model's logits at a position, as a function of
the sequence's tokens before it (penalties, logit bias; grammar constraints build on the same
contract).

Speculation scores K+1 positions in one target pass; each row is processed exactly as it would
be alone, with the drafts before it counted as if they were already output. The target's p at
every verified position is then the p AR would use after the same tokens, so every method stays
exactly distributed as AR under the same processors. Processing the drafter's q the same way
only raises acceptance.

The engine applies processors to raw logits, BEFORE temperature/top-k/top-p
(``specdec.sampling.probabilities``). A request without processors has an empty list, and every
caller skips the work entirely: today's path, unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class LogitsProcessor(Protocol):
    """A deterministic change of the model's logits at a position, as a function of the
    sequence's tokens before that position (prompt + output so far). Row j of a call is
    processed exactly as it would be alone, so speculation (which scores K+1 positions in one
    pass) stays exactly distributed as AR with the same processor."""

    def process(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor:
        """logits: float32 [len(drafts) + 1, vocab]; row j holds the raw logits at the position
        after prompt + output + drafts[:j]. Returns processed logits of the same shape
        (forbidden tokens = -inf). Must not keep state that depends on `drafts` after it
        returns (a stateful matcher advances through drafts and rolls them back)."""
        ...


# Optional, for drafters (one call per drafted position): a processor may also define
#     process_last(logits [1, vocab], output, drafts) -> [1, vocab]
# the row after ALL of ``drafts`` only. Without it, ``process_last`` below calls ``process``
# with filler rows before the one that matters.


@dataclass(frozen=True)
class TokenVocabulary:
    """What a processor may need to know of the tokenizer. ``size``: its number of tokens
    (logit rows from ``size`` on are model padding, never sampled). ``tokenizer``: the
    ``specdec.tokenizer.Tokenizer`` for processors that read token text (None where it is not
    loaded, e.g. in the SSD worker)."""

    size: int
    eos_token_ids: tuple[int, ...] = ()
    tokenizer: Any = None


# SamplingParams fields that build_processors reads: the SSD worker gets them (by name) in its
# prefill message and builds the same processors for its q. Other processors add their fields.
PROCESSOR_FIELDS = ["presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"]
PROCESSOR_FIELDS += ["constraint", "stop_token_ids"]  # constraints.py (stop tokens end a grammar)


def processor_fields(params) -> dict:
    """The processor fields of ``params`` that are set (picklable: they cross processes)."""
    out = {}
    for name in PROCESSOR_FIELDS:
        value = getattr(params, name, None)
        if value not in (None, [], {}):
            out[name] = value
    return out


def build_processors(params, prompt_ids: Sequence[int], vocab: TokenVocabulary | None) -> list:
    """A request's processors, in the order they apply; empty when it uses none. Raises
    ValueError for a parameter the vocabulary rules out (a logit_bias id it does not have)."""
    processors: list = []
    penalties = Penalties.from_params(params, prompt_ids, vocab)
    if penalties is not None:
        processors.append(penalties)
    if getattr(params, "constraint", None) is not None:  # last: its -inf are final
        from specdec.constraints import GrammarConstraint

        processors.append(GrammarConstraint.from_params(params, vocab))
    return processors


class Penalties:
    """OpenAI's presence/frequency penalties and logit_bias, and the repetition penalty (HF,
    vLLM), in one pass over the few tokens they touch, in this order (as vLLM applies them):

        logit[v] += bias[v]
        seen(v) = v in prompt or output:   logit[v] = logit[v] / r if logit[v] > 0 else logit[v] * r
        logit[v] -= presence * (count[v] > 0) + frequency * count[v]

    count[v] counts v in the output before the position (the drafts before a row included).
    Only columns of tokens that occur (or carry a bias) change: gathered, changed, scattered
    back; nothing runs over the vocabulary but one copy of the logits."""

    def __init__(
        self,
        prompt_ids: Sequence[int],
        presence: float = 0.0,
        frequency: float = 0.0,
        repetition: float = 1.0,
        logit_bias: dict[int, float] | None = None,
    ):
        self.presence = float(presence)
        self.frequency = float(frequency)
        self.repetition = float(repetition)
        bias = dict(logit_bias or {})
        self.bias_ids = torch.tensor(sorted(bias), dtype=torch.int64)
        self.bias = torch.tensor([bias[i] for i in sorted(bias)], dtype=torch.float64)
        prompt = torch.as_tensor(list(prompt_ids), dtype=torch.int64)
        # the prompt matters only to the repetition penalty
        self.prompt_ids = prompt.unique() if self.repetition != 1.0 else prompt[:0]

    @classmethod
    def from_params(cls, params, prompt_ids, vocab: TokenVocabulary | None) -> Penalties | None:
        presence = params.presence_penalty or 0.0
        frequency = params.frequency_penalty or 0.0
        repetition = 1.0 if params.repetition_penalty is None else params.repetition_penalty
        bias = {int(k): float(v) for k, v in (params.logit_bias or {}).items()}
        if vocab is not None:
            bad = sorted(t for t in bias if not 0 <= t < vocab.size)
            if bad:
                raise ValueError(
                    "invalid sampling parameter: logit_bias has token ids outside the "
                    f"vocabulary of {vocab.size} tokens: {bad[:5]}"
                )
        bias = {t: b for t, b in bias.items() if b != 0}
        if presence == 0 and frequency == 0 and repetition == 1 and not bias:
            return None
        return cls(prompt_ids, presence, frequency, repetition, bias)

    def process(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor:
        if logits.shape[0] != len(drafts) + 1:
            raise ValueError(f"{logits.shape[0]} logit rows for {len(drafts)} drafts")
        return self._apply(logits, output, drafts)

    def process_last(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor:
        return self._apply(logits, list(output) + list(drafts), ())

    def _apply(self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]):
        rows = logits.shape[0]
        out_t = torch.as_tensor(list(output), dtype=torch.int64)
        drafts_t = torch.as_tensor(list(drafts), dtype=torch.int64)
        n_out, n_drafts = len(out_t), len(drafts_t)
        ids, where = torch.cat([out_t, drafts_t, self.prompt_ids, self.bias_ids]).unique(
            return_inverse=True
        )
        if len(ids) == 0:
            return logits
        width = len(ids)
        at_out = where[:n_out]
        at_drafts = where[n_out : n_out + n_drafts]
        at_prompt = where[n_out + n_drafts : n_out + n_drafts + len(self.prompt_ids)]
        at_bias = where[n_out + n_drafts + len(self.prompt_ids) :]

        # count[j, u]: occurrences of ids[u] in the output and drafts[:j]
        x = logits[:, ids]
        if not x.is_floating_point() or x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        dtype = x.dtype
        count = torch.bincount(at_out, minlength=width).to(dtype).expand(rows, -1)
        if n_drafts:
            step = torch.zeros(rows, width, dtype=dtype)
            step[torch.arange(1, n_drafts + 1), at_drafts] = 1.0
            count = count + step.cumsum(0)
        if len(at_bias):
            bias = torch.zeros(width, dtype=dtype)
            bias[at_bias] = self.bias.to(dtype)
            x = x + bias
        if self.repetition != 1.0:
            seen = count > 0
            if len(at_prompt):
                in_prompt = torch.zeros(width, dtype=torch.bool)
                in_prompt[at_prompt] = True
                seen = seen | in_prompt
            r = self.repetition
            x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
        if self.frequency:
            x = x - self.frequency * count
        if self.presence:
            x = x - self.presence * (count > 0).to(dtype)
        out = logits.clone()
        out[:, ids] = x.to(out.dtype)
        return out


# -- applying a sequence's processors --------------------------------------------------------
def process(
    processors: Sequence, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
) -> torch.Tensor:
    """``processors`` in order on logits [len(drafts) + 1, V] (row j after drafts[:j])."""
    for p in processors:
        logits = p.process(logits, output, drafts)
    return logits


def process_last(
    processors: Sequence, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
) -> torch.Tensor:
    """``processors`` on logits [1, V] at the position after output + ALL of drafts (a
    drafter's next token). Processors without ``process_last`` get ``process`` on the row
    repeated len(drafts) + 1 times (a row is processed as if alone: the others are filler)."""
    for p in processors:
        last = getattr(p, "process_last", None)
        if last is not None:
            logits = last(logits, output, drafts)
        else:
            full = logits.expand(len(drafts) + 1, -1).contiguous()
            logits = p.process(full, output, drafts)[-1:]
    return logits


def process_sequences(
    logits: torch.Tensor, seqs: Sequence, drafts: Sequence[Sequence[int]] | None = None
) -> torch.Tensor:
    """One position per sequence: row b of logits [B, V] follows seqs[b]'s output and then
    drafts[b] (none: the next output token). Rows without processors are left as they are;
    ``logits`` itself is returned when no sequence has any."""
    if not any(s.processors for s in seqs):
        return logits
    logits = logits.clone()
    for b, s in enumerate(seqs):
        if s.processors:
            d = () if drafts is None else drafts[b]
            logits[b] = process_last(s.processors, logits[b : b + 1], s.output_ids, d)[0]
    return logits


def process_verify_rows(
    logits: torch.Tensor, seqs: Sequence, drafts: torch.Tensor, k: torch.Tensor
) -> torch.Tensor:
    """The target's rows of a speculative round, logits [B, K+1, V]: row j of sequence b
    follows its output and drafts[b, :j], for j <= k[b] (later rows are padding)."""
    if not any(s.processors for s in seqs):
        return logits
    logits = logits.clone()
    for b, s in enumerate(seqs):
        if s.processors:
            kb = int(k[b])
            d = drafts[b, :kb].tolist()
            logits[b, : kb + 1] = process(s.processors, logits[b, : kb + 1], s.output_ids, d)
    return logits


def check_penalty(name: str, value, low: float, high: float | None = None) -> str | None:
    """A problem with a penalty value (None if it is fine): a finite number in [low, high]
    (above ``low`` if ``high`` is None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{name} must be a finite number, got {value!r}"
    if high is None:
        return None if value > low else f"{name} must be > {low}, got {value}"
    return None if low <= value <= high else f"{name} must be in [{low}, {high}], got {value}"
