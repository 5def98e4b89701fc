"""Exact output distributions of tiny models and a chi-square goodness-of-fit test."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable

import torch
from scipy import stats

from specdec.model import Transformer
from specdec.sampling import SamplingParams, probabilities


def seeded(params: SamplingParams, n: int) -> list[SamplingParams]:
    """``n`` copies of ``params`` with seeds 0..n-1: independent samples, yet a run that CI
    repeats draws the very same ones (a statistical test never flakes from run to run)."""
    return [dataclasses.replace(params, seed=i) for i in range(n)]


def penalized_logits(
    logits: torch.Tensor, prompt: list[int], output: list[int], params: SamplingParams
) -> torch.Tensor:
    """The definition of the penalties, token by token in float64: logit_bias added; then for
    tokens seen in prompt or output the repetition penalty (positive logits divided, the
    others multiplied); then presence * (count > 0) + frequency * count subtracted, counting
    the output. ``logits`` [V]; returns a new fp64 tensor."""
    x = logits.double().clone()
    for token, bias in (params.logit_bias or {}).items():
        x[token] += bias
    r = 1.0 if params.repetition_penalty is None else params.repetition_penalty
    presence, frequency = params.presence_penalty or 0.0, params.frequency_penalty or 0.0
    seen, count = set(prompt) | set(output), Counter(output)
    for v in range(x.shape[0]):
        if v in seen and r != 1.0:
            x[v] = x[v] / r if x[v] > 0 else x[v] * r
        x[v] -= presence * (count[v] > 0) + frequency * count[v]
    return x


def exact_sequence_probs(
    folder,
    prompt: list[int],
    params: SamplingParams,
    length: int,
    eos: set[int] | None = None,
    process: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None,
) -> dict[tuple[int, ...], float]:
    """P(first ``length`` generated tokens) under the target's own distribution, by
    enumeration of every prefix (fp64 products). Sequences ending in EOS stop early.

    Logits processors: each prefix's logits [V] go through ``process(logits, output so
    far)`` (default: the penalties ``params`` asks for, by their definition above) before the
    sampling transform, position by position."""
    if process is None and any(
        getattr(params, f) is not None
        for f in ("presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias")
    ):

        def process(logits, output):
            return penalized_logits(logits, prompt, output, params)

    model = Transformer.from_folder(folder)
    eos_t = torch.tensor(sorted(eos or []), dtype=torch.int64)
    out: dict[tuple[int, ...], float] = {}
    seqs = torch.zeros(1, 0, dtype=torch.int64)  # live prefixes
    mass = torch.ones(1, dtype=torch.float64)
    for step in range(length):
        n = seqs.shape[0]
        cache = model.new_cache(n, len(prompt) + length + 2)
        tokens = torch.cat([torch.tensor(prompt).expand(n, -1), seqs], 1)
        logits = model.forward(tokens, cache, logits_at=torch.full((n, 1), tokens.shape[1] - 1))
        logits = logits[:, 0].double()
        if process is not None:
            logits = torch.stack([process(row, out) for row, out in zip(logits, seqs.tolist())])
        probs = probabilities(logits, [params] * n)
        joint = mass[:, None] * probs  # [n, V]
        rows, toks = joint.nonzero(as_tuple=True)
        seqs = torch.cat([seqs[rows], toks[:, None]], 1)
        mass = joint[rows, toks]
        ended = torch.isin(toks, eos_t) | (step == length - 1)
        for seq, m in zip(seqs[ended].tolist(), mass[ended].tolist()):
            out[tuple(seq)] = m
        seqs, mass = seqs[~ended], mass[~ended]
    return out


def chi_square_pvalue(samples: list[tuple], probs: dict[tuple, float], min_expected=20.0):
    """Goodness of fit of ``samples`` to ``probs``; cells expected < min_expected are pooled.
    A sample outside the support fails outright (p = 0). The pooling threshold is well above
    the textbook 5: with cells of expected count ~5 a single Poisson outlier gives the
    statistic a much heavier tail than chi-square's, and p-values near 1e-5 come out of
    samples whose true probability is ~1e-3."""
    n = len(samples)
    counts = Counter(samples)
    if any(s not in probs for s in counts):
        return 0.0
    big = [s for s, p in probs.items() if p * n >= min_expected]
    obs = [counts[s] for s in big]
    exp = [probs[s] * n for s in big]
    rest_p = 1.0 - sum(probs[s] for s in big)
    if rest_p * n >= 1e-9:
        obs.append(n - sum(obs))
        exp.append(rest_p * n)
    if len(obs) < 2:
        return 1.0
    scale = n / sum(exp)
    return float(stats.chisquare(obs, [e * scale for e in exp]).pvalue)


def all_sequences(vocab: int, length: int):
    return itertools.product(range(vocab), repeat=length)
