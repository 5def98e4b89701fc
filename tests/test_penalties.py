"""Logits processors (processors.py) and the penalties built on them: presence, frequency and
repetition penalties and logit_bias, exact under every decoding method."""

from __future__ import annotations

import pytest
import torch

from specdec import LLM, SamplingParams, sequence
from specdec.processors import LogitsProcessor

PROMPTS = ["w3 w4 w5", "w10 w11 w10 w11", "w7", "w1 w2 w3 w4 w5 w6 w7 w8"]


class ForbidRepeats:
    """A toy processor: the token just before each position is forbidden there."""

    def process(self, logits, output, drafts):
        history = list(output) + list(drafts)
        out = logits.clone()
        for j in range(out.shape[0]):
            before = history[: len(output) + j]
            if before:
                out[j, before[-1]] = float("-inf")
        return out


def test_a_custom_processor_runs_in_every_method(tiny_dirs, monkeypatch):
    """The engine hooks: a processor built for a request changes AR's choice, and SD and
    prompt lookup give AR's tokens with it (greedy)."""
    assert isinstance(ForbidRepeats(), LogitsProcessor)
    monkeypatch.setattr(sequence, "build_processors", lambda p, ids, v: [ForbidRepeats()])
    v16, draft = tiny_dirs["v16"], tiny_dirs["v16_draft"]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [o.token_ids for o in LLM(v16, dtype="float32").generate(PROMPTS, params)]
    assert all(a != b for w in want for a, b in zip(w, w[1:]))
    for llm in (
        LLM(v16, draft_model=draft, method="sd", num_speculative_tokens=3, dtype="float32"),
        LLM(v16, method="ngram", num_speculative_tokens=3, dtype="float32"),
    ):
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want


def test_requests_without_processors_have_none():
    tok = type("Tok", (), {"vocab_size": 16})()
    seq = sequence.Sequence([1, 2], SamplingParams(), tok, [2])
    assert seq.processors == []
    seq = sequence.Sequence([1, 2], SamplingParams(presence_penalty=0.5), tok, [2])
    assert len(seq.processors) == 1
    with pytest.raises(ValueError, match="logit_bias has token ids outside the vocabulary"):
        sequence.Sequence([1, 2], SamplingParams(logit_bias={16: 1.0}), tok, [2])
    assert torch.is_tensor(seq.processors[0].process(torch.zeros(1, 16), [], []))
