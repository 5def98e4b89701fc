"""What a finished request returns: RequestOutput (its metrics: ``specdec.metrics``)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.logprobs import TokenLogprob
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
    # with SamplingParams.logprobs: one entry per generated token (specdec.logprobs)
    logprobs: list[TokenLogprob] | None = None
    # with SamplingParams.prompt_logprobs: one per prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None


def to_output(seq: Sequence, method: str) -> RequestOutput:
    return RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.prompt_ids,
        text=seq.text,
        token_ids=list(seq.output_ids),
        finish_reason=seq.finish_reason,
        metrics=RequestMetrics.from_sequence(seq, method),
        seed=None if seq.params.greedy else seq.rng.seed,
        logprobs=None if seq.logprobs is None else list(seq.logprobs),
        prompt_logprobs=seq.prompt_logprobs,
    )
