"""One request's SSD counters, and the metrics they give (with the speed model's prediction)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.controller import expected_tokens
from specdec.metrics import SSDMetrics


@dataclass
class SSDCounters:
    """Kept by the SSD drafter for one request (``SequenceStats.drafter``)."""

    hits: int = 0
    lookups: int = 0
    hits_by_k: dict[int, int] = field(default_factory=dict)
    lookups_by_k: dict[int, int] = field(default_factory=dict)
    idle_s: float = 0.0  # the target waiting on the worker
    backup_rounds: int = 0  # misses answered by a just-in-time draft
    fallback_rounds: int = 0  # rounds drafted by prompt lookup, without the worker
    backup_s: float = 0.0
    worker_busy_s: float = 0.0
    failures: int = 0

    def count_lookup(self, accepted: int, hit: bool, answered: bool, wait_s: float) -> None:
        self.idle_s += wait_s
        self.lookups += 1
        self.hits += hit
        self.lookups_by_k[accepted] = self.lookups_by_k.get(accepted, 0) + 1
        self.hits_by_k[accepted] = self.hits_by_k.get(accepted, 0) + hit
        if not hit and answered:
            self.backup_rounds += 1

    def metrics(self, seq_stats) -> SSDMetrics:
        """With the speed model's prediction: E = (1 - a^(K+1)) / (1 - a) tokens per round at
        acceptance a, and a round costs T_verify + (1 - p_hit) * T_backup + T_other (drafting is
        off the critical path on a hit)."""
        p_hit = self.hits / self.lookups if self.lookups else 0.0
        by_k = {k: self.hits_by_k.get(k, 0) / n for k, n in sorted(self.lookups_by_k.items())}
        out = SSDMetrics(
            hit_rate=p_hit,
            hit_rate_by_k=by_k,
            lookups=self.lookups,
            target_idle_s=self.idle_s,
            drafter_busy_s=self.worker_busy_s,
            backup_rounds=self.backup_rounds,
            fallback_rounds=self.fallback_rounds,
            worker_failures=self.failures,
        )
        s, rounds = seq_stats, seq_stats.rounds
        if rounds and s.drafted:
            k = max(1, round(s.drafted / max(1, len(s.accepted_lengths))))
            e = expected_tokens(s.per_token_acceptance(), k)
            t_verify = s.verify_time / rounds
            t_other = max(0.0, s.decode_time - s.verify_time - self.idle_s) / rounds
            # waiting on the worker: mostly just-in-time drafts after misses
            t_backup = self.idle_s / max(1, self.lookups - self.hits)
            t_round = t_verify + (1 - p_hit) * t_backup + t_other
            out.model_tokens_per_s = e / t_round
            out.model_t_verify_s = t_verify
            out.model_t_backup_s = t_backup
            out.model_tokens_per_round = e
        return out
