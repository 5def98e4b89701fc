"""What a request's decoding cost and how speculation went: typed metrics, one aggregation.

Every consumer (``RequestOutput.metrics``, ``LLM.metrics()``, ``specdec generate --stats``, the
server's ``speculative`` object and Prometheus gauges, the bench table) reads these fields. A
``RequestMetrics`` is also a read-only mapping over its flat JSON form (``m["acceptance_rate"]``),
whose keys are the field names, with the SSD figures prefixed ``ssd_``.

A drafter with figures of its own (SSD) attaches an object with a ``metrics(stats)`` method to
``SequenceStats.drafter``; the request's metrics call it, so this module knows no drafter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol


@dataclass
class SpeculationMetrics:
    """How a speculative request's drafts fared."""

    drafted_tokens: int
    accepted_tokens: int
    judged_tokens: int  # drafts the verifier reached: the accepted and the first rejected
    acceptance_rate: float  # accepted / drafted
    per_token_acceptance: float  # alpha: accepted / judged (drafts after a rejection unjudged)
    mean_tokens_per_round: float
    per_position_acceptance: list[float | None]
    accepted_length_histogram: dict[int, int]
    draft_time_s: float
    verify_time_s: float
    other_time_s: float

    @classmethod
    def from_stats(cls, s) -> SpeculationMetrics:
        hist: dict[int, int] = {}
        for a in s.accepted_lengths:
            hist[a] = hist.get(a, 0) + 1
        return cls(
            drafted_tokens=s.drafted,
            accepted_tokens=s.accepted,
            judged_tokens=s.judged,
            acceptance_rate=s.accepted / s.drafted,
            per_token_acceptance=s.per_token_acceptance(),
            mean_tokens_per_round=tokens_per_round(s.accepted, len(s.accepted_lengths)),
            per_position_acceptance=[
                a / p if p else None for a, p in zip(s.position_accepted, s.position_proposed)
            ],
            accepted_length_histogram=dict(sorted(hist.items())),
            draft_time_s=s.draft_time,
            verify_time_s=s.verify_time,
            other_time_s=max(0.0, s.decode_time - s.draft_time - s.verify_time),
        )


@dataclass
class SSDMetrics:
    """SSD's speculation cache and worker, and its speed model's prediction (README, SSD)."""

    hit_rate: float
    hit_rate_by_k: dict[int, float]
    lookups: int
    target_idle_s: float  # the target waiting for speculations (misses, late trees)
    drafter_busy_s: float
    backup_rounds: int
    fallback_rounds: int  # rounds drafted by prompt lookup without the worker
    worker_failures: int
    model_tokens_per_s: float | None = None
    model_t_verify_s: float | None = None
    model_t_backup_s: float | None = None
    model_tokens_per_round: float | None = None


class DrafterStats(Protocol):
    """Per-request counters a drafter keeps (``SequenceStats.drafter``)."""

    def metrics(self, stats) -> SSDMetrics: ...


def tokens_per_round(accepted: int, rounds: int) -> float:
    """Every round emits its accepted drafts plus one token of the target's."""
    return (accepted + rounds) / max(rounds, 1)


@dataclass
class RequestMetrics(Mapping):
    method: str
    prompt_tokens: int
    generated_tokens: int
    wall_time_s: float
    tokens_per_s: float
    rounds: int
    target_forwards: int
    time_to_first_token_s: float | None = None
    decode_tokens_per_s: float | None = None  # tokens after the first / time after the first
    requests: int | None = None  # set on totals over several requests (``aggregate``)
    speculation: SpeculationMetrics | None = None
    ssd: SSDMetrics | None = None

    @classmethod
    def from_sequence(cls, seq, method: str) -> RequestMetrics:
        s = seq.stats
        end = s.finished or s.first_token or s.arrival
        wall = max(end - s.arrival, 1e-9)
        n = len(seq.output_ids)
        decode = None
        if s.first_token is not None and n > 1 and end > s.first_token:
            decode = (n - 1) / (end - s.first_token)
        return cls(
            method=method,
            prompt_tokens=len(seq.prompt_ids),
            generated_tokens=n,
            wall_time_s=wall,
            tokens_per_s=n / wall,
            rounds=s.rounds,
            target_forwards=s.target_forwards,
            time_to_first_token_s=(s.first_token - s.arrival) if s.first_token else None,
            decode_tokens_per_s=decode,
            speculation=SpeculationMetrics.from_stats(s) if s.drafted else None,
            ssd=s.drafter.metrics(s) if s.drafter is not None else None,
        )

    # -- the flat mapping (JSON, the API's ``metrics[...]``) ---------------------------------
    def as_dict(self) -> dict[str, Any]:
        """The flat form: figures that do not apply (None) are left out."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        del out["speculation"], out["ssd"]
        if self.speculation is not None:
            out.update(asdict(self.speculation))
        if self.ssd is not None:
            out.update({f"ssd_{k}": v for k, v in asdict(self.ssd).items()})
        return {k: v for k, v in out.items() if v is not None}

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())


def aggregate(metrics: list[RequestMetrics], wall_time_s: float, method: str) -> RequestMetrics:
    """Totals over several requests decoded together (tokens/s over ``wall_time_s``); the
    speculation totals, and for SSD the mean hit rate over requests that looked one up."""
    generated = sum(m.generated_tokens for m in metrics)
    out = RequestMetrics(
        method=method,
        prompt_tokens=sum(m.prompt_tokens for m in metrics),
        generated_tokens=generated,
        wall_time_s=wall_time_s,
        tokens_per_s=generated / max(wall_time_s, 1e-9),
        rounds=sum(m.rounds for m in metrics),
        target_forwards=sum(m.target_forwards for m in metrics),
        requests=len(metrics),
    )
    spec = [m.speculation for m in metrics if m.speculation is not None]
    if spec:
        out.speculation = _sum_speculation(spec)
    ssd = [m.ssd for m in metrics if m.ssd is not None and m.ssd.lookups]
    if ssd:
        out.ssd = _mean_ssd(ssd)
    return out


def _sum_speculation(spec: list[SpeculationMetrics]) -> SpeculationMetrics:
    drafted = sum(s.drafted_tokens for s in spec)
    accepted = sum(s.accepted_tokens for s in spec)
    hist: dict[int, int] = {}
    for s in spec:
        for k, v in s.accepted_length_histogram.items():
            hist[k] = hist.get(k, 0) + v
    judged = sum(s.judged_tokens for s in spec)
    return SpeculationMetrics(
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        judged_tokens=judged,
        acceptance_rate=accepted / max(drafted, 1),
        per_token_acceptance=accepted / judged if judged else 0.0,
        mean_tokens_per_round=tokens_per_round(accepted, sum(hist.values())),
        per_position_acceptance=[],
        accepted_length_histogram=dict(sorted(hist.items())),
        draft_time_s=sum(s.draft_time_s for s in spec),
        verify_time_s=sum(s.verify_time_s for s in spec),
        other_time_s=sum(s.other_time_s for s in spec),
    )


def _mean_ssd(ssd: list[SSDMetrics]) -> SSDMetrics:
    return SSDMetrics(
        hit_rate=sum(s.hit_rate for s in ssd) / len(ssd),
        hit_rate_by_k={},
        lookups=sum(s.lookups for s in ssd),
        target_idle_s=sum(s.target_idle_s for s in ssd),
        drafter_busy_s=sum(s.drafter_busy_s for s in ssd),
        backup_rounds=sum(s.backup_rounds for s in ssd),
        fallback_rounds=sum(s.fallback_rounds for s in ssd),
        worker_failures=sum(s.worker_failures for s in ssd),
    )
