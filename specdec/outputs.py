"""What a finished request returns: RequestOutput (its metrics: ``specdec.metrics``)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.metrics import RequestMetrics
from specdec.sequence import Sequence


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated tokens only
    finish_reason: str | None  # "stop" | "length" | "abort"
    metrics: RequestMetrics
    # the seed this request sampled with (drawn from the OS when none was given): with
    # SamplingParams(seed=..., sampler="coupled") it gives the same text with any method
    seed: int | None = None


def to_output(seq: Sequence, method: str) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.prompt_ids,
        text=seq.text,
        token_ids=list(seq.output_ids),
        finish_reason=seq.finish_reason,
        metrics=RequestMetrics.from_sequence(seq, method),
        seed=None if seq.params.greedy else seq.rng.seed,
    )
