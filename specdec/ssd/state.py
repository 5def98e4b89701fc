"""The worker's state for one sequence: its cache row, its speculations and their cache slots,
and the tokens it holds ahead of the pending one.

Invariant, as in the target: the row holds every token but the pending one, and possibly
more: the speculation the worker just returned was drafted through the pending token and
d_1..d_{K-1}, so the row keeps those keys/values ("ahead"; moved out of the tree on a hit)
with the draft's top tokens after each. The next round's trunk [pending, d_1..d_K] then needs
a pass over d_K alone instead of all K+1 tokens (the target does not know; the start it sends
is still "all but the pending token").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from specdec.coupling import PositionNoise
from specdec.sampling import SamplingParams
from specdec.ssd.cache import SpeculationCache


@dataclass
class Ahead:
    """Tokens held past the prefix the target knows of: [pending, d_1, ...] from slot
    ``start``, and the draft's top tokens after each (the trunk's candidates next round)."""

    start: int
    tokens: list[int]
    tops: list[list[int]]


@dataclass
class Branch:
    """Where a cached speculation's keys/values lie in the row: the slots of its root and
    d_1..d_{K-1}, and the draft's top tokens after each."""

    slots: list[int]
    tops: list[list[int]]


@dataclass
class SequenceState:
    row: int
    params: SamplingParams
    rng: random.Random  # the worker's own stream for this sequence
    noise: PositionNoise | None = None  # the request's noise, for a coupled sequence
    length: int = 0  # tokens held in the cache row
    fanout: list[int] = field(default_factory=list)
    trunk_start: int = 0  # slot of this round's b_prev
    trunk: list[int] = field(default_factory=list)  # this round's [b_prev, d_1..d_K]
    specs: SpeculationCache = field(default_factory=SpeculationCache)
    branches: dict[tuple[int, int], Branch] = field(default_factory=dict)  # keyed as specs
    ahead: Ahead | None = None
    # logits processors (penalties, ...) and what they read: the sequence's tokens up to the
    # pending one, of which the first prompt_len are the prompt (kept only with processors)
    processors: list = field(default_factory=list)
    prompt_len: int = 0
    history: list[int] = field(default_factory=list)

    @property
    def output(self) -> list[int]:
        """The output so far, the pending token included."""
        return self.history[self.prompt_len :]

    def commit(self, start: int, tokens: list[int]) -> None:
        """The sequence's tokens from index ``start`` on are now ``tokens``."""
        if self.processors:
            self.history[start:] = tokens

    def forget_speculations(self) -> None:
        self.specs.clear()
        self.branches.clear()

    def forget_ahead(self) -> None:
        self.ahead = None

    def held_trunk(self, start: int, catch_up: list[int], trunk: list[int]) -> int:
        """How many leading tokens of a trunk starting at ``start`` (after ``catch_up``) the row
        already holds ahead, top tokens included."""
        ahead = self.ahead
        if ahead is None or catch_up or start != ahead.start:
            return 0
        m = 0
        for a, t in zip(ahead.tokens, trunk):
            if a != t:
                break
            m += 1
        return min(m, len(ahead.tops))
