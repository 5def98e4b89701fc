"""Adaptive speculation length: pick K each round to maximize expected tokens per second.

Cost model (Leviathan et al., 2023): with per-token acceptance rate alpha, a round that drafts K
tokens yields E(K) = (1 - alpha^(K+1)) / (1 - alpha) tokens and costs
t_draft(K) + t_verify(tokens in the pass) + t_other. We measure t_draft by the K drafted (a draft
model's is K times a step; SSD's is the target's wait for a worker whose tree grows with K, and
whose one core falls behind past some K, so not linear) after the first rounds' exploration
(there each K follows a different one, and a K = 1 round after a K = 0 round waited 52 ms for
the worker to catch up: that one sample had kept K = 1 and 2 looking dear for good), t_verify
as a function of the number of tokens in the target pass (both interpolated between the sizes
seen so far; beyond them t_draft grows by the mean cost per drafted position, and below the
smallest K seen in proportion to K), and alpha per sequence (a running estimate with a prior),
then take the K in 0..k_max with the best total E / cost for the batch. K = 0 is a plain AR
round: where speculation does not pay (a weak drafter on prose) the controller stops drafting.
Every ``probe_every`` rounds it tries a neighbour of its choice instead (K = 1 from 0; otherwise one
up, then one down): the pass sizes it never picks would otherwise keep whatever cost they
showed once, and acceptance may have changed. While K = 0 stays the choice, the wait between
probes doubles (up to 16x): a probe from K = 0 costs more than its round, because the drafter
first catches up on every token since it last drafted (measured on an AVX2 day, where drafting
does not pay: probing every 16 rounds made SD 0.78x AR). Such a probe drafts in two rounds,
the second one's drafting time a sample, and an estimate unsampled for ``STALE_ROUNDS`` takes
a probe's sample whole: after another process slowed the cores for a while, SD drafts again
at the next probe (it had stayed at K = 0 for good). A request's first round is no drafting
sample either: SSD's worker prefills the prompt in it (0.3-0.8 s), which had kept a fresh
process at K = 1-2 through its first requests where K = 4 was best. SSD's worker drafts the
next round's speculation while this round verifies, so for it the controller decides each K a
round ahead (``lookahead``): a probe's K is then the depth drafted, and the wait counts for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.sequence import Sequence


def expected_tokens(alpha: float, k: int) -> float:
    """E[tokens per round] for K drafted tokens at acceptance rate alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _nondecreasing(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The closest nondecreasing fit (pool adjacent violators) to times by pass size. A bigger
    pass never costs less; a noisy sample that says so (t(3) > t(4) after one round each)
    would make the sizes around it look better or worse than they are."""
    blocks: list[list[float]] = []  # [sum, count] of pooled neighbours
    for _, v in points:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [b[0] / b[1] for b in blocks for _ in range(b[1])]
    return [(t, f) for (t, _), f in zip(points, fitted)]


def _fitted(table: dict) -> list[tuple[int, float]]:
    """The nondecreasing fit of running estimates by size, for the sizes seen."""
    return _nondecreasing(sorted((t, e.value) for t, e in table.items() if e.value is not None))


def _interpolate(known: list[tuple[int, float]], x: int) -> float | None:
    """A cost at size x from a fit (``_fitted``): linear between the sizes seen and beyond them
    (flat if only one size was seen, as in memory-bound passes); None if none was."""
    if not known:
        return None
    if len(known) == 1:
        return known[0][1]
    for (t0, v0), (t1, v1) in zip(known, known[1:]):
        if t0 <= x <= t1:
            return v0 + (v1 - v0) * (x - t0) / (t1 - t0)
    (t0, v0), (t1, v1) = (known[0], known[1]) if x < known[0][0] else known[-2:]
    slope = max(0.0, (v1 - v0) / (t1 - t0))
    return max(1e-6, v1 + slope * (x - t1)) if x > t1 else max(1e-6, v0)


# rounds after which an estimate's last sample counts for nothing against a fresh one (from
# half that, for less and less): a pass size or drafting cost seen only in probes must follow
# the machine, which another process on the cores may have slowed for a while and freed since
STALE_ROUNDS = 64


@dataclass
class _Ema:
    """A running estimate: the plain mean of the first samples (so that one slow first pass,
    cold caches and all, does not linger), then an exponential average that follows drift,
    and a sample after a long gap (``STALE_ROUNDS``) replaces the stale value."""

    value: float | None = None
    weight: float = 0.3
    count: int = 0
    seen: int = 0  # the round of the last sample

    def add(self, x: float, now: int) -> None:
        self.count += 1
        stale = min(1.0, max(0.0, 2.0 * (now - self.seen) / STALE_ROUNDS - 1.0))
        w = max(self.weight, 1.0 / self.count, stale)
        self.value = x if self.value is None else (1 - w) * self.value + w * x
        self.seen = now


class SpeculationController:
    def __init__(
        self,
        k_max: int = 8,
        fixed_k: int | None = None,
        prior_alpha: float = 0.7,
        prior_weight: float = 4.0,
        explore: tuple[int, ...] = (4, 0, 1, 8),
        probe_every: int = 16,
        k_min: int = 0,
        k_plan: int | None = None,
        lookahead: bool = False,
    ):
        if fixed_k is not None and fixed_k < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {fixed_k}")
        self.k_max = fixed_k if fixed_k is not None else k_max
        self.k_min = min(k_min, self.k_max)  # SSD: a round without drafts strands the worker
        # the most K it asks for: a drafter that lengthens its drafts while confident
        # (``draft_confidence``) is asked for 1 and goes on by itself, up to k_max; asked for
        # more, the tokens it must draft unconditionally cost more than they bring (README)
        self.k_plan = self.k_max if k_plan is None else min(k_plan, self.k_max)
        self.fixed_k = fixed_k
        self.prior_alpha, self.prior_weight = prior_alpha, prior_weight
        self.explore = [min(max(k, self.k_min), self.k_plan) for k in explore]
        self.probe_every = probe_every
        self.t_draft = _Ema()  # seconds per drafted position (batch of the round)
        self.t_draft_by_k: dict[int, _Ema] = {}  # a round's drafting seconds by its K
        self.t_other = _Ema()
        self.t_verify: dict[int, _Ema] = {}  # target pass time by tokens in the pass
        self.rounds = 0
        self._last_k: int | None = None  # the previous round's K
        self._since_probe = 0
        self._probe_wait = probe_every  # rounds until the next probe
        self._probe_up = True
        self._probe_again = False  # a probe from K = 0 drafts in two rounds (see _probe)
        self.last_choice: dict = {}
        # a drafter that prepares round t+1's drafts during round t (SSD's worker, while the
        # target verifies) drafts them to the depth decided then: round t+1's K is chosen in
        # round t (``next_k``). Chosen in round t + 1, a probe one up drafted nothing more (the
        # speculation held only the old depth): in a trace, SSD asked for K = 2 in 8 of 67
        # rounds of a code prompt, verified 1 in 7 of them, and stayed at K = 1 where K = 4
        # was best.
        self.lookahead = lookahead
        self.next_k: int | None = None

    # -- acceptance --------------------------------------------------------------------------
    def alpha(self, seq: Sequence) -> float:
        # (with k_plan = 1 the drafts a confident drafter added count too: their acceptance
        # is part of what a drafting round yields, and the only choice left is 0 or 1)
        return seq.stats.per_token_acceptance(self.prior_alpha, self.prior_weight)

    # -- costs -------------------------------------------------------------------------------
    def observe_round(
        self,
        batch: int,
        k: int,
        draft_s: float,
        verify_s: float,
        other_s: float,
        first: bool = False,
    ):
        """A round's costs. ``first``: a sequence had its first round in it, whose drafting
        includes what the drafter pays once per request (SSD's worker prefills the prompt
        there: 0.3-0.8 s, where a round's wait is ~2 ms on a hit), so it is no sample of K."""
        self.rounds += 1
        now = self.rounds
        tokens = batch * (k + 1)
        self.t_verify.setdefault(tokens, _Ema()).add(verify_s, now)
        # a round after a K = 0 round pays the drafter's catch-up on every token since it last
        # drafted: a cost of leaving K = 0, not of its K (taken as one, a single such round
        # made K = 1 look dear enough that an SD run stayed at K = 0 for good)
        after_ar, self._last_k = self._last_k == 0, k
        # with lookahead the drafting the target waited for was the next round's, to its K
        drafted = k if self.next_k is None else self.next_k
        if k > 0 and drafted > 0 and not after_ar and not first:
            self.t_draft.add(draft_s / drafted, now)
            if self.rounds > len(self.explore):  # past the exploration's changes of K
                # weight 0.1: SSD's wait is ~1 ms on a hit, 50-90 ms on a miss; an average
                # over ~10 rounds, not the last two or three
                self.t_draft_by_k.setdefault(drafted, _Ema(weight=0.1)).add(draft_s, now)
        self.t_other.add(other_s, now)

    def verify_time(self, tokens: int) -> float | None:
        return _interpolate(_fitted(self.t_verify), tokens)

    def draft_time(self, k: int) -> float:
        """Drafting seconds of a round with K = k, from the rounds of the K seen."""
        if k == 0:
            return 0.0
        per_position = self.t_draft.value or 0.0
        known = _fitted(self.t_draft_by_k)
        if not known:
            return k * per_position
        (k_lo, v_lo), (k_hi, v_hi) = known[0], known[-1]
        if k < k_lo:
            return v_lo * k / k_lo
        if k > k_hi:
            return v_hi + (k - k_hi) * per_position
        return _interpolate(known, k)

    # -- the choice --------------------------------------------------------------------------
    def choose_k(self, seqs: list[Sequence]) -> int:
        """One K for the round (each sequence may still cap it by what it has left)."""
        if self.fixed_k is not None:
            return self.fixed_k
        if not self.lookahead:
            return self._decide(seqs, self.rounds)
        k = self._decide(seqs, self.rounds) if self.next_k is None else self.next_k
        self.next_k = self._decide(seqs, self.rounds + 1)
        return k

    def _decide(self, seqs: list[Sequence], r: int) -> int:
        """The K of round r (the next round's with ``lookahead``), probes included."""
        # measure a few pass sizes before trusting the model; K = 0 among them, because the
        # cost of a plain 1-token pass extrapolated from larger passes is too high, and that
        # error favours drafting exactly where it does not pay
        if r < len(self.explore):
            self.last_choice = {"k": self.explore[r]}
            return self.explore[r]
        alphas = [self.alpha(s) for s in seqs]
        t_o = self.t_other.value or 0.0
        best_k, best_rate, rates = 0, -1.0, {}
        for k in range(self.k_min, self.k_plan + 1):
            cost = self.verify_time(len(seqs) * (k + 1))
            if cost is None:
                continue
            cost += self.draft_time(k) + t_o
            rate = sum(expected_tokens(a, k) for a in alphas) / cost
            rates[k] = rate
            if rate > best_rate:
                best_k, best_rate = k, rate
        self.last_choice = {"k": best_k, "alpha": sum(alphas) / len(alphas), "rates": rates}
        if self._probe_again:
            self._probe_again = False
            return max(best_k, 1)
        self._since_probe += 1
        if self._since_probe >= self._probe_wait:
            self._since_probe = 0
            longer = min(2 * self._probe_wait, 16 * self.probe_every)
            self._probe_wait = longer if best_k == 0 else self.probe_every
            return self._probe(best_k)
        if best_k > 0:
            self._probe_wait = self.probe_every
        return best_k

    def _probe(self, best_k: int) -> int:
        """A neighbour of the best K, to refresh its cost and acceptance. From K = 0 the probe
        drafts in two rounds: the first pays the drafter's catch-up (no drafting sample), the
        second measures what drafting costs now."""
        up = best_k + 1 <= self.k_plan and (self._probe_up or best_k - 1 < self.k_min)
        if not up and best_k - 1 < self.k_min:
            return best_k  # nothing else to try
        self._probe_up = not self._probe_up
        self._probe_again = best_k == 0
        return best_k + 1 if up else best_k - 1
