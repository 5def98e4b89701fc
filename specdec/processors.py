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

import numpy as np
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


# Optional, for drafters (one call per drafted position, maybe for many branches): a processor
# may also define
#     process_rows(logits [R, vocab], output, extras: list of token lists) -> [R, vocab]
# row r at the position after output + extras[r]. Without it, ``process_rows`` below calls
# ``process`` for each row, with filler rows before the one that matters.


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
    vLLM), in this order (as vLLM applies them):

        logit[v] += bias[v]
        seen(v) = v in prompt or output:   logit[v] = logit[v] / r if logit[v] > 0 else logit[v] * r
        logit[v] -= presence * (count[v] > 0) + frequency * count[v]

    count[v] counts v in the output before the position (the drafts before a row included).
    Only the columns of tokens that occur or carry a bias change: they are gathered, changed
    for all rows at once (counts per row: the output's, plus the row's own drafts scattered
    in), and put back. The output's counts are kept between calls and extended by the tokens
    committed since (the committed output only grows)."""

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
        # columns: every token the penalties may touch without a draft (bias ids, the
        # prompt's when the repetition penalty reads it, the output's so far)
        self._col: dict[int, int] = {}
        self._ids: list[int] = []
        self._count = np.zeros(0)  # in the output, per column
        self._in_prompt = np.zeros(0, dtype=bool)
        self._bias = np.zeros(0)
        bias = dict(logit_bias or {})
        prompt = set(prompt_ids) if self.repetition != 1.0 else set()
        self._grow(sorted(set(bias) | prompt))
        for token, b in bias.items():
            self._bias[self._col[token]] = b
        for token in prompt:
            self._in_prompt[self._col[token]] = True
        self._counted: list[int] = []  # the output counted so far

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

    def _grow(self, tokens) -> None:
        new = [t for t in dict.fromkeys(tokens) if t not in self._col]
        if not new:
            return
        for t in new:
            self._col[t] = len(self._ids)
            self._ids.append(t)
        n = len(new)
        self._count = np.concatenate([self._count, np.zeros(n)])
        self._in_prompt = np.concatenate([self._in_prompt, np.zeros(n, dtype=bool)])
        self._bias = np.concatenate([self._bias, np.zeros(n)])

    def _count_output(self, output: Sequence[int]) -> None:
        """Count the tokens committed since the last call (recount if ``output`` is not an
        extension of what was counted: another sequence's, or a test's)."""
        n = len(self._counted)
        if len(output) < n or (n and output[n - 1] != self._counted[-1]):
            self._count[:] = 0
            self._counted, n = [], 0
        new = list(output[n:])
        if new:
            self._grow(new)
            np.add.at(self._count, [self._col[t] for t in new], 1.0)
            self._counted.extend(new)

    def process(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor:
        if logits.shape[0] != len(drafts) + 1:
            raise ValueError(f"{logits.shape[0]} logit rows for {len(drafts)} drafts")
        return self.process_rows(logits, output, [drafts[:j] for j in range(len(drafts) + 1)])

    def process_last(
        self, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
    ) -> torch.Tensor:
        return self.process_rows(logits, output, [drafts])

    def process_rows(
        self, logits: torch.Tensor, output: Sequence[int], extras: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Row r of logits [R, V] at the position after output + extras[r] (a drafter's
        branches; ``process`` is the case extras[j] = drafts[:j])."""
        self._count_output(output)
        ids = list(self._ids)
        col = self._col
        extra_cols: dict[int, int] = {}
        rows, cols = [], []
        for r, extra in enumerate(extras):
            for t in extra:
                c = col.get(t)
                if c is None:
                    c = extra_cols.get(t)
                    if c is None:
                        c = extra_cols[t] = len(ids)
                        ids.append(t)
                rows.append(r)
                cols.append(c)
        if not ids:
            return logits
        width, n_static = len(ids), len(self._ids)
        count = np.zeros((len(extras), width))
        count[:, :n_static] = self._count
        np.add.at(count, (rows, cols), 1.0)
        index = torch.tensor(ids, dtype=torch.int64)
        x = logits[:, index].double().numpy()
        if self._bias.any():
            x[:, :n_static] += self._bias
        if self.repetition != 1.0:
            seen = count > 0
            seen[:, :n_static] |= self._in_prompt
            r = self.repetition
            x = np.where(seen, np.where(x > 0, x / r, x * r), x)
        if self.frequency:
            x -= self.frequency * count
        if self.presence:
            x -= self.presence * (count > 0)
        out = logits.clone()
        out[:, index] = torch.from_numpy(x).to(out.dtype)
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
    drafter's next token)."""
    return process_rows(processors, logits, output, [drafts])


def process_rows(
    processors: Sequence,
    logits: torch.Tensor,
    output: Sequence[int],
    extras: Sequence[Sequence[int]],
) -> torch.Tensor:
    """``processors`` on logits [R, V], row r at the position after output + extras[r] (the
    branches of a drafter's tree). A processor's own ``process_rows`` does all rows at once;
    otherwise each row goes through ``process`` with the row repeated len(extras[r]) + 1
    times (a row is processed as if alone: the others are filler)."""
    for p in processors:
        many = getattr(p, "process_rows", None)
        if many is not None:
            logits = many(logits, output, extras)
            continue
        rows = []
        for r, extra in enumerate(extras):
            full = logits[r : r + 1].expand(len(extra) + 1, -1).contiguous()
            rows.append(p.process(full, output, extra)[-1:])
        logits = torch.cat(rows)
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
