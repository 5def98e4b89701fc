"""Log-probabilities of tokens under the distribution they are drawn from: one definition for
every place that reports them (generated tokens under every method, prompt scores, the server).

- A sampled request (temperature > 0): log p~, where p~ is the sampling distribution of
  ``sampling.probabilities`` (temperature, then top-k, then top-p); tokens outside the kept
  set get -inf, and the kept ones are renormalized over the set.
- A greedy request (temperature 0): its distribution is a point mass, which would say nothing,
  so the log-probabilities are those of the untempered model distribution, log_softmax(logits).

Callers pass the logits that ``probabilities`` saw (the processed ones, once logits processors
exist), so a reported logprob is that of the very distribution the token was drawn from. Under
speculation these are the rows of the target's verify pass, never the drafter's q: a drafted
token the verifier accepted is distributed as p, and so is the token it emits after a rejection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling import SamplingParams, probabilities


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the N most likely tokens (id, logprob), most likely first


def log_distribution(
    logits: torch.Tensor, params: Sequence[SamplingParams], vocab_size: int | None = None
) -> torch.Tensor:
    """log of each row's distribution (see the module docstring) for logits [N, ..., V] under
    ``params`` (one per row N); entries >= ``vocab_size`` (padding rows) get -inf. fp32 (fp64
    for fp64 input), computed as a log-softmax rather than log(p) so that small
    probabilities keep their precision."""
    shape = logits.shape
    x = logits.reshape(shape[0], -1, shape[-1])
    if x.dtype != torch.float64:
        x = x.float()
    if vocab_size is not None and vocab_size < x.shape[-1]:
        x = x.clone()
        x[..., vocab_size:] = -math.inf
    out = torch.empty_like(x)
    for i, p in enumerate(params):
        row = x[i]
        if not p.greedy:
            row = row / p.temperature
            if p.top_k > 0 or p.top_p < 1:  # the kept set is the one the sampler uses
                kept = probabilities(x[i : i + 1], [p])[0] > 0
                row = row.masked_fill(~kept, -math.inf)
        out[i] = torch.log_softmax(row, dim=-1)
    return out.reshape(shape)


def pick(logp: torch.Tensor, tokens: Sequence[int], top_n: int = 0) -> list[TokenLogprob]:
    """The entry of each token of ``tokens`` in logp [len(tokens), V] (row j for token j), with
    the ``top_n`` most likely tokens of its row."""
    n = len(tokens)
    if n == 0:
        return []
    at = logp[torch.arange(n), torch.as_tensor(list(tokens), dtype=torch.long)].tolist()
    if top_n > 0:
        vals, ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
    else:
        tops = [[] for _ in range(n)]
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(tokens, at, tops)]


def emitted_logprobs(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    vocab_size: int,
    emitted: Sequence[Sequence[int]],
) -> list[list[TokenLogprob | None]]:
    """The logprob entries of the tokens a pass emitted: row b of logits [B, P, V] (the logits
    ``probabilities`` was given) emitted ``emitted[b][j]`` from position j. Rows whose request
    did not ask for logprobs (``params.logprobs is None``) get None entries, and cost nothing."""
    out: list[list[TokenLogprob | None]] = [[None] * len(e) for e in emitted]
    want = [b for b, p in enumerate(params) if p.logprobs is not None and emitted[b]]
    if not want:
        return out
    width = max(len(emitted[b]) for b in want)
    logp = log_distribution(logits[want, :width], [params[b] for b in want], vocab_size)
    for i, b in enumerate(want):
        out[b] = pick(logp[i, : len(emitted[b])], emitted[b], params[b].logprobs)
    return out
