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

    def process_rows(
        self, logits: torch.Tensor, output: Sequence[int], extras: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Row r of logits [R, V] at the position after output + extras[r] (a drafter's
        branches; ``process`` is the case extras[j] = drafts[:j])."""
        job = Job([self], output, list(range(len(extras))), list(extras))
        return process_jobs(logits, [job])

    def _columns(self, output: Sequence[int], extras: Sequence[Sequence[int]]):
        """The columns the rows touch: token ids [W], each row's count of each [R, W] (the
        output's plus its own extras), and whether each was in the prompt and its bias [W]."""
        self._count_output(output)
        ids = self._ids
        n_static = len(ids)
        col = self._col
        extra_cols: dict[int, int] = {}
        rows, cols = [], []
        for r, extra in enumerate(extras):
            for t in extra:
                c = col.get(t)
                if c is None:
                    c = extra_cols.get(t)
                    if c is None:
                        c = extra_cols[t] = n_static + len(extra_cols)
                rows.append(r)
                cols.append(c)
        if extra_cols:
            ids = ids + list(extra_cols)
        width = len(ids)
        count = np.zeros((len(extras), width))
        count[:, :n_static] = self._count
        if rows:
            np.add.at(count, (rows, cols), 1.0)
        in_prompt, bias = self._in_prompt, self._bias
        if width > n_static:
            in_prompt = np.concatenate([in_prompt, np.zeros(width - n_static, dtype=bool)])
            bias = np.concatenate([bias, np.zeros(width - n_static)])
        return ids, count, in_prompt, bias

    @staticmethod
    def process_jobs(logits: torch.Tensor, jobs: list[Job]) -> None:
        """Every job's rows of logits [N, V] in place, all at once: each job's touched
        (row, token) entries side by side with their own penalties, one gather, the
        arithmetic, one scatter."""
        parts: dict[str, list] = {k: [] for k in ("row", "tok", "count", "prompt", "bias")}
        params, sizes = [], []
        for job in jobs:
            (pen,) = job.processors
            ids, count, in_prompt, bias = pen._columns(job.output, job.extras)
            n_rows, width = count.shape
            if not width:
                continue
            parts["row"].append(np.repeat(np.asarray(job.rows, dtype=np.int64), width))
            parts["tok"].append(np.tile(np.asarray(ids, dtype=np.int64), n_rows))
            parts["count"].append(count.ravel())
            parts["prompt"].append(np.tile(in_prompt, n_rows))
            parts["bias"].append(np.tile(bias, n_rows))
            params.append((pen.presence, pen.frequency, pen.repetition))
            sizes.append(n_rows * width)
        if not sizes:
            return
        row, tok, count, in_prompt, bias = (np.concatenate(parts[k]) for k in parts)
        presence, frequency, r = np.repeat(np.array(params), sizes, axis=0).T
        index = (torch.from_numpy(row), torch.from_numpy(tok))
        x = logits[index].double().numpy() + bias
        seen = (count > 0) | in_prompt
        x = np.where(seen & (r != 1.0), np.where(x > 0, x / r, x * r), x)
        x -= frequency * count + presence * (count > 0)
        logits[index] = torch.from_numpy(x).to(logits.dtype)


# -- applying processors -----------------------------------------------------------------------
@dataclass
class Job:
    """Some rows of a logits matrix that follow one sequence: row ``rows[i]`` sits at the
    position after ``output`` + ``extras[i]``. ``drafts``: set when the rows are a verify
    call's, extras[j] = drafts[:j] (processors then get their ``process`` call)."""

    processors: Sequence
    output: Sequence[int]
    rows: list[int]
    extras: list[Sequence[int]]
    drafts: Sequence[int] | None = None


def process_jobs(logits: torch.Tensor, jobs: list[Job]) -> torch.Tensor:
    """``logits`` [N, V] with every job's rows through its processors (a new tensor; the
    same one if no job has any). Jobs whose processors are just the penalties are done
    together in one pass (``Penalties.process_jobs``); others one by one."""
    jobs = [j for j in jobs if j.processors]
    if not jobs:
        return logits
    logits = logits.clone()
    together = [j for j in jobs if _just_penalties(j)]
    if together:
        Penalties.process_jobs(logits, together)
    for job in jobs:
        if _just_penalties(job):
            continue
        rows = logits[job.rows]
        for p in job.processors:
            rows = _one(p, rows, job)
        logits[job.rows] = rows
    return logits


def _just_penalties(job: Job) -> bool:
    return len(job.processors) == 1 and type(job.processors[0]) is Penalties


def _one(p, rows: torch.Tensor, job: Job) -> torch.Tensor:
    """One processor on one job's rows: ``process`` for a verify call, else ``process_rows``
    if it has one, else ``process`` row by row with filler rows before the one that matters."""
    if job.drafts is not None:
        return p.process(rows, job.output, job.drafts)
    many = getattr(p, "process_rows", None)
    if many is not None:
        return many(rows, job.output, job.extras)
    out = []
    for r, extra in enumerate(job.extras):
        full = rows[r : r + 1].expand(len(extra) + 1, -1).contiguous()
        out.append(p.process(full, job.output, extra)[-1:])
    return torch.cat(out)


def process_rows(
    processors: Sequence,
    logits: torch.Tensor,
    output: Sequence[int],
    extras: Sequence[Sequence[int]],
) -> torch.Tensor:
    """``processors`` on logits [R, V], row r at the position after output + extras[r]."""
    return process_jobs(logits, [Job(processors, output, list(range(len(extras))), list(extras))])


def process_last(
    processors: Sequence, logits: torch.Tensor, output: Sequence[int], drafts: Sequence[int]
) -> torch.Tensor:
    """``processors`` on logits [1, V] at the position after output + ALL of drafts (a
    drafter's next token)."""
    return process_rows(processors, logits, output, [drafts])


def process_sequences(
    logits: torch.Tensor, seqs: Sequence, drafts: Sequence[Sequence[int]] | None = None
) -> torch.Tensor:
    """One position per sequence: row b of logits [B, V] follows seqs[b]'s output and then
    drafts[b] (none: the next output token). Rows without processors are left as they are;
    ``logits`` itself is returned when no sequence has any."""
    if not any(s.processors for s in seqs):
        return logits
    jobs = [
        Job(s.processors, s.output_ids, [b], [() if drafts is None else drafts[b]])
        for b, s in enumerate(seqs)
        if s.processors
    ]
    return process_jobs(logits, jobs)


def process_verify_rows(
    logits: torch.Tensor, seqs: Sequence, drafts: torch.Tensor, k: torch.Tensor
) -> torch.Tensor:
    """The target's rows of a speculative round, logits [B, K+1, V]: row j of sequence b
    follows its output and drafts[b, :j], for j <= k[b] (later rows are padding)."""
    if not any(s.processors for s in seqs):
        return logits
    bsz, width, vocab = logits.shape
    jobs = []
    for b, s in enumerate(seqs):
        if s.processors:
            d = drafts[b, : int(k[b])].tolist()
            rows = [b * width + j for j in range(len(d) + 1)]
            jobs.append(Job(s.processors, s.output_ids, rows, [d[:j] for j in range(len(rows))], d))
    return process_jobs(logits.reshape(bsz * width, vocab), jobs).reshape(bsz, width, vocab)


def check_penalty(name: str, value, low: float, high: float | None = None) -> str | None:
    """A problem with a penalty value (None if it is fine): a finite number in [low, high]
    (above ``low`` if ``high`` is None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{name} must be a finite number, got {value!r}"
    if high is None:
        return None if value > low else f"{name} must be > {low}, got {value}"
    return None if low <= value <= high else f"{name} must be in [{low}, {high}], got {value}"
