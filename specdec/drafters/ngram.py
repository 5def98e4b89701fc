"""Prompt-lookup drafting: no model. Find the latest earlier occurrence of the sequence's last
n tokens in prompt + output and propose what followed it. A deterministic proposal is a point
mass q, which the verifier handles exactly (accept with probability p(d))."""

from __future__ import annotations

import torch

from specdec.drafters.base import Drafter, Proposal, point_masses
from specdec.sequence import Sequence


def lookup(tokens: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """The up-to-k tokens that followed the latest earlier match of the last n tokens, trying
    the longest n first (n_max down to n_min). Empty if nothing matches."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        tail = tokens[length - n :]
        first = tail[0]
        for start in range(length - n - 1, -1, -1):  # latest match first
            if tokens[start] == first and tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, vocab: int, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {n_min}, {n_max}")
        self.vocab = vocab
        self.n_max, self.n_min = n_max, n_min

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        drafts = [
            lookup(s.all_ids, k, self.n_max, self.n_min) if k else [] for s, k in zip(seqs, ks)
        ]
        kmax = max((len(d) for d in drafts), default=0)
        tokens = torch.zeros(len(seqs), kmax, dtype=torch.int64)
        for i, d in enumerate(drafts):
            tokens[i, : len(d)] = torch.tensor(d, dtype=torch.int64)
        k = torch.tensor([len(d) for d in drafts], dtype=torch.int64)
        return Proposal(tokens, k, point_masses(tokens, self.vocab))
