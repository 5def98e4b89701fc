"""What a finished request returns: RequestOutput and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.sequence import Sequence


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated tokens only
    finish_reason: str | None  # "stop" | "length" | "abort"
    metrics: dict = field(default_factory=dict)


def request_metrics(seq: Sequence, method: str) -> dict:
    s = seq.stats
    end = s.finished or s.first_token or s.arrival
    wall = max(end - s.arrival, 1e-9)
    n = len(seq.output_ids)
    m = {
        "method": method,
        "prompt_tokens": len(seq.prompt_ids),
        "generated_tokens": n,
        "wall_time_s": wall,
        "time_to_first_token_s": (s.first_token - s.arrival) if s.first_token else None,
        "tokens_per_s": n / wall,
        "rounds": s.rounds,
        "target_forwards": s.target_forwards,
    }
    if s.first_token is not None and n > 1 and end > s.first_token:
        m["decode_tokens_per_s"] = (n - 1) / (end - s.first_token)
    if s.drafted:
        m.update(speculation_metrics(s))
    if "ssd" in s.extra:
        from specdec.ssd.drafter import ssd_metrics

        m.update(ssd_metrics(s))
    return m


def speculation_metrics(s) -> dict:
    hist: dict[int, int] = {}
    for a in s.accepted_lengths:
        hist[a] = hist.get(a, 0) + 1
    return {
        "drafted_tokens": s.drafted,
        "accepted_tokens": s.accepted,
        "acceptance_rate": s.accepted / s.drafted,
        "per_token_acceptance": s.per_token_acceptance(),  # alpha: accepted / judged
        "mean_tokens_per_round": (s.accepted + len(s.accepted_lengths))
        / max(1, len(s.accepted_lengths)),
        "per_position_acceptance": [
            a / p if p else None for a, p in zip(s.position_accepted, s.position_proposed)
        ],
        "accepted_length_histogram": dict(sorted(hist.items())),
        "draft_time_s": s.draft_time,
        "verify_time_s": s.verify_time,
        "other_time_s": max(0.0, s.decode_time - s.draft_time - s.verify_time),
    }


def to_output(seq: Sequence, method: str) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.prompt_ids,
        text=seq.text,
        token_ids=list(seq.output_ids),
        finish_reason=seq.finish_reason,
        metrics=request_metrics(seq, method),
    )


def aggregate_metrics(outs: list[RequestOutput], wall: float, method: str) -> dict:
    """Totals over one ``generate`` call (tokens/s over its wall time)."""
    gen = sum(o.metrics["generated_tokens"] for o in outs)
    agg = {
        "method": method,
        "requests": len(outs),
        "prompt_tokens": sum(o.metrics["prompt_tokens"] for o in outs),
        "generated_tokens": gen,
        "wall_time_s": wall,
        "tokens_per_s": gen / max(wall, 1e-9),
    }
    spec = [o.metrics for o in outs if "drafted_tokens" in o.metrics]
    if spec:
        drafted = sum(m["drafted_tokens"] for m in spec)
        accepted = sum(m["accepted_tokens"] for m in spec)
        hist: dict[int, int] = {}
        for m in spec:
            for k, v in m["accepted_length_histogram"].items():
                hist[k] = hist.get(k, 0) + v
        rounds = sum(hist.values())
        agg.update(
            drafted_tokens=drafted,
            accepted_tokens=accepted,
            acceptance_rate=accepted / max(drafted, 1),
            mean_tokens_per_round=(accepted + rounds) / max(rounds, 1),
            accepted_length_histogram=dict(sorted(hist.items())),
        )
    return agg
