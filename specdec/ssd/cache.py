"""The speculation cache: next-round speculations keyed by verification outcome (k, token)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Speculation:
    """K draft tokens and, per token, the sparse proposal q' it was drawn from (token ids and
    their probabilities; every other token has probability 0)."""

    tokens: list[int]
    q_ids: np.ndarray  # [K, N] int64
    q_probs: np.ndarray  # [K, N] float64


class SpeculationCache:
    def __init__(self):
        self._entries: dict[tuple[int, int], Speculation] = {}

    def store(self, k: int, token: int, spec: Speculation) -> None:
        self._entries[(k, token)] = spec

    def lookup(self, k: int, token: int) -> Speculation | None:
        """The speculation prepared for "k drafts accepted, then ``token``", if any."""
        return self._entries.get((k, token))

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def outcomes(self) -> list[tuple[int, int]]:
        return list(self._entries)
