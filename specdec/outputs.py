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


def to_output(seq: Sequence, method: str) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.prompt_ids,
        text=seq.text,
        token_ids=list(seq.output_ids),
        finish_reason=seq.finish_reason,
        metrics=RequestMetrics.from_sequence(seq, method),
    )
