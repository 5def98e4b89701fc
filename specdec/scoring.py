"""Scoring text with the target model: the logprob of every token given the tokens before it.

The texts go through the target in batched passes of their own (a KV cache made for the pass
and dropped after it), so scoring never touches the caches of running requests. Each pass
feeds every token but the last (the last is only predicted) and asks for logits only where a
token is scored, so scoring a short continuation after a long prompt computes one output head
row per continuation token. Texts are grouped shortest first under a token budget; a text
longer than the budget goes through alone, in chunks that extend its cache.

What a logprob means (raw model distribution, or the distribution a request samples from) is
``logprobs.log_distribution``'s definition, shared with generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.logprobs import TokenLogprob, log_distribution, pick
from specdec.model import Transformer
from specdec.sampling import SamplingParams

TOKENS_PER_PASS = 2048  # padded tokens fed in one pass (bounds activations and the cache)
LOGITS_PER_PASS = 1 << 26  # logits in one pass (256 MB of fp32)
RAW = SamplingParams(temperature=0)  # the untempered model distribution (logprobs.py)


@dataclass
class ScoreOutput:
    """One scored text. Entry j is about ``token_ids[j]``."""

    prompt_token_ids: list[int]
    token_ids: list[int]  # the tokens scored: the prompt's, or the continuation's
    tokens: list[str]  # each one's text
    logprobs: list[float | None]  # log p(token | all before it); None for a text's first token
    # with top_logprobs=N > 0: the N most likely tokens (id, logprob) at each position
    top_logprobs: list[list[tuple[int, float]] | None] | None
    is_greedy: bool  # every scored token was (one of) the most likely at its position

    @property
    def total(self) -> float:
        """The log-likelihood of the scored tokens (those that have a logprob)."""
        return sum(lp for lp in self.logprobs if lp is not None)


@dataclass
class _Item:
    index: int
    ids: list[int]
    start: int  # the first position scored (>= 1)
    params: SamplingParams
    top_n: int

    @property
    def fed(self) -> int:  # tokens that go through the model: all but the last
        return len(self.ids) - 1

    @property
    def scored(self) -> int:
        return len(self.ids) - self.start


def score_ids(
    target: Transformer,
    texts: Sequence[Sequence[int]],
    starts: Sequence[int],
    params: Sequence[SamplingParams],
    top_n: Sequence[int],
    vocab_size: int | None = None,
) -> list[list[TokenLogprob]]:
    """For each text, the entries of its tokens from position ``starts[i]`` (>= 1) on, under
    ``params[i]`` (``log_distribution``'s definition), with ``top_n[i]`` alternatives each."""
    items = [
        _Item(i, list(t), max(1, s), p, n)
        for i, (t, s, p, n) in enumerate(zip(texts, starts, params, top_n))
    ]
    out: list[list[TokenLogprob]] = [[] for _ in items]
    todo = sorted((it for it in items if it.scored > 0), key=lambda it: it.fed)
    vocab = target.config.vocab_size
    for batch in _batches(todo, vocab):
        if len(batch) == 1 and _too_big([batch[0]], vocab):
            logp = _chunked(target, batch[0], vocab, vocab_size)
            out[batch[0].index] = pick(logp, batch[0].ids[batch[0].start :], batch[0].top_n)
            continue
        for it, logp in zip(batch, _one_pass(target, batch, vocab_size)):
            out[it.index] = pick(logp, it.ids[it.start :], it.top_n)
    return out


def _too_big(batch: list[_Item], vocab: int) -> bool:
    rows = len(batch)
    fed = max(it.fed for it in batch)
    scored = max(it.scored for it in batch)
    return rows * fed > TOKENS_PER_PASS or rows * scored * vocab > LOGITS_PER_PASS


def _batches(items: list[_Item], vocab: int) -> list[list[_Item]]:
    """Consecutive groups (items sorted by length) that fit one pass; an item too big for a
    pass on its own forms a group alone."""
    batches: list[list[_Item]] = []
    for it in items:
        if batches and not _too_big(batches[-1] + [it], vocab):
            batches[-1].append(it)
        else:
            batches.append([it])
    return batches


def _one_pass(
    target: Transformer, batch: list[_Item], vocab_size: int | None
) -> list[torch.Tensor]:
    """logp [scored, V] of each item, from one ragged pass over all of them."""
    fed = max(it.fed for it in batch)
    width = max(it.scored for it in batch)
    tokens = torch.zeros(len(batch), fed, dtype=torch.int64)
    at = torch.zeros(len(batch), width, dtype=torch.int64)
    for b, it in enumerate(batch):
        tokens[b, : it.fed] = torch.tensor(it.ids[:-1], dtype=torch.int64)
        # the logits at position j predict token j + 1; repeat the last where a row is short
        at[b] = torch.arange(it.start - 1, it.start - 1 + width).clamp(max=it.fed - 1)
    cache = target.new_cache(len(batch), fed)
    num_new = torch.tensor([it.fed for it in batch], dtype=torch.int64)
    logits = target.forward(tokens, cache, num_new=num_new, logits_at=at)
    del cache
    logp = log_distribution(logits, [it.params for it in batch], vocab_size)
    return [logp[b, : it.scored] for b, it in enumerate(batch)]


def _chunked(target: Transformer, it: _Item, vocab: int, vocab_size: int | None) -> torch.Tensor:
    """logp [scored, V] of one long item, fed in chunks that extend one cache row."""
    step = max(1, min(TOKENS_PER_PASS, LOGITS_PER_PASS // vocab))
    cache = target.new_cache(1, it.fed)
    parts = []
    for lo in range(0, it.fed, step):
        hi = min(lo + step, it.fed)
        chunk = torch.tensor([it.ids[lo:hi]], dtype=torch.int64)
        first = max(lo, it.start - 1)  # positions of this chunk whose logits are needed
        if first >= hi:
            target.forward(chunk, cache, logits_at=torch.zeros(1, 1, dtype=torch.int64))
            continue
        at = torch.arange(first - lo, hi - lo, dtype=torch.int64)[None, :]
        logits = target.forward(chunk, cache, logits_at=at)
        parts.append(log_distribution(logits, [it.params], vocab_size)[0])
    return torch.cat(parts)


def score_output(
    tokenizer,
    prompt_ids: list[int],
    ids: list[int],
    entries: list[TokenLogprob],
    first_is_prompt: bool,
    top_n: int,
) -> ScoreOutput:
    """A ScoreOutput for the scored tokens ``ids``: ``entries`` (each with at least one
    alternative) for all of them, or for all but the first when ``first_is_prompt`` (a
    text's first token has no logprob); alternatives trimmed to ``top_n``."""
    full: list[TokenLogprob | None] = ([None] if first_is_prompt else []) + list(entries)
    return ScoreOutput(
        prompt_token_ids=list(prompt_ids),
        token_ids=list(ids),
        tokens=[tokenizer.token_text(t) for t in ids],
        logprobs=[None if e is None else e.logprob for e in full],
        top_logprobs=[None if e is None else e.top[:top_n] for e in full] if top_n else None,
        is_greedy=all(e.logprob >= e.top[0][1] for e in entries),
    )
