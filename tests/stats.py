"""Exact output distributions of tiny models and a chi-square goodness-of-fit test."""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from scipy import stats

from specdec.model import Transformer
from specdec.sampling import SamplingParams, probabilities


def exact_sequence_probs(
    folder, prompt: list[int], params: SamplingParams, length: int, eos: set[int] | None = None
) -> dict[tuple[int, ...], float]:
    """P(first ``length`` generated tokens) under the target's own distribution, by
    enumeration (fp64 accumulation). Sequences ending in EOS stop early."""
    model = Transformer.from_folder(folder)
    eos = eos or set()
    out: dict[tuple[int, ...], float] = {}
    frontier = {(): 1.0}
    for _ in range(length):
        prefixes = list(frontier)
        cache = model.new_cache(len(prefixes), len(prompt) + length + 2)
        tokens = torch.tensor([prompt + list(p) for p in prefixes])
        logits = model.forward(tokens, cache)[:, -1]
        probs = probabilities(logits, [params] * len(prefixes)).double()
        nxt = {}
        for prefix, row in zip(prefixes, probs):
            for tok in row.nonzero().flatten().tolist():
                q = frontier[prefix] * float(row[tok])
                seq = prefix + (tok,)
                (out if tok in eos else nxt)[seq] = q
        frontier = nxt
    out.update(frontier)
    return out


def chi_square_pvalue(samples: list[tuple], probs: dict[tuple, float], min_expected=5.0):
    """Goodness of fit of ``samples`` to ``probs``; cells expected < min_expected are pooled.
    A sample outside the support fails outright (p = 0)."""
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
