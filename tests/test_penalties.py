"""Logits processors (processors.py) and the penalties built on them: presence, frequency and
repetition penalties and logit_bias. Each matches its float64 definition; every method gives
AR's tokens under them (greedy, and coupled with a seed), alone and batched with requests
without them; sampled output follows the exact penalized target distribution (chi-square,
both samplers, with a power check against a verifier that forgets the drafted prefix); the
server takes them, answers 400 naming the bad one, and gives the Python API's text."""

from __future__ import annotations

import dataclasses
import pickle

import httpx
import openai
import pytest
import torch
from server_utils import ServerThread
from stats import chi_square_pvalue, exact_sequence_probs, penalized_logits, seeded

from specdec import LLM, SamplingParams, sequence
from specdec.decoders import speculative
from specdec.processors import (
    Job,
    LogitsProcessor,
    Penalties,
    TokenVocabulary,
    build_processors,
    process_jobs,
    process_last,
)
from specdec.server.app import create_app

PROMPTS = ["w3 w4 w5", "w10 w11 w10 w11", "w7", "w1 w2 w3 w4 w5 w6 w7 w8"]
PROMPT = "w3 w4 w5 w3 w4"  # repeats, so prompt lookup has something to propose
LENGTH = 4

MODES = {
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=0.8),
    "repetition": dict(repetition_penalty=1.6),
    "bias": dict(logit_bias={"5": 3.0, 6: -100.0, 9: 1.5}),
    "combined": dict(
        presence_penalty=-0.5,
        frequency_penalty=0.6,
        repetition_penalty=1.3,
        logit_bias={7: 2.0, 8: -1.0},
    ),
}


# -- the penalties against their definition ---------------------------------------------------
def test_penalties_by_hand():
    """A worked example of each penalty (the reference formula in stats.py is checked too)."""
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    output = [0, 0, 1]

    def run(prompt=(), **kw):
        params = SamplingParams(**kw)
        (proc,) = build_processors(params, list(prompt), None)
        got = proc.process(logits, output, [])[0]
        ref = penalized_logits(logits[0], list(prompt), output, params)
        assert torch.allclose(got.double(), ref, atol=1e-6)
        return got.tolist()

    assert run(presence_penalty=0.5) == [1.5, -1.5, 0.5, 3.0]
    assert run(frequency_penalty=0.25) == [1.5, -1.25, 0.5, 3.0]
    assert run(presence_penalty=0.5, frequency_penalty=0.25) == [1.0, -1.75, 0.5, 3.0]
    # repetition over prompt (token 3) and output (0, 1): positive divided, negative multiplied
    assert run(prompt=[3], repetition_penalty=2.0) == [1.0, -2.0, 0.5, 1.5]
    assert run(logit_bias={"2": -100, 3: 1}) == [2.0, -1.0, -99.5, 4.0]
    # bias first, then repetition: 0.5 - 1 = -0.5 is multiplied
    assert run(prompt=[2], logit_bias={2: -1}, repetition_penalty=2.0) == [1.0, -2.0, -1.0, 3.0]


@pytest.mark.parametrize("mode", list(MODES))
def test_each_row_matches_the_float64_formula(mode):
    """Row j of a call counts drafts[:j] as output; random logits, prompts, outputs and
    drafts over a 50-token vocabulary; -inf logits stay -inf and nothing becomes NaN."""
    gen = torch.Generator().manual_seed(7)
    params = SamplingParams(**MODES[mode])
    for trial in range(20):
        prompt = torch.randint(0, 50, (int(torch.randint(1, 12, (1,), generator=gen)),))
        output = torch.randint(0, 20, (trial,), generator=gen).tolist()  # repeats likely
        drafts = torch.randint(0, 20, (trial % 6,), generator=gen).tolist()
        logits = torch.randn(len(drafts) + 1, 50, generator=gen) * 4
        logits[:, 40] = float("-inf")
        (proc,) = build_processors(params, prompt.tolist(), TokenVocabulary(50))
        got = proc.process(logits, output, drafts)
        assert got.shape == logits.shape and got.dtype == torch.float32
        assert not torch.isnan(got).any() and torch.isneginf(got[:, 40]).all()
        for j in range(len(drafts) + 1):
            want = penalized_logits(logits[j], prompt.tolist(), output + drafts[:j], params)
            assert torch.allclose(got[j].double(), want, rtol=1e-6, atol=1e-5), (trial, j)
        # a drafter's call for the last row alone agrees with the full call
        last = process_last([proc], logits[-1:], output, drafts)
        assert torch.equal(last, got[-1:])
        assert torch.equal(logits, logits.clone())  # the input is left as it was


def test_process_last_without_a_fast_path_uses_filler_rows():
    class LastSeen:  # forbids the token before the position; has no process_last
        def process(self, logits, output, drafts):
            history = list(output) + list(drafts)
            out = logits.clone()
            for j in range(out.shape[0]):
                out[j, history[len(output) + j - 1]] = float("-inf")
            return out

    got = process_last([LastSeen()], torch.zeros(1, 5), [1], [2, 3])
    assert got.tolist() == [[0.0, 0.0, 0.0, float("-inf"), 0.0]]


def test_parameters_are_validated():
    def bad(match, **kw):
        with pytest.raises(ValueError, match=match):
            SamplingParams(**kw)

    bad(r"presence_penalty must be in \[-2.0, 2.0\]", presence_penalty=2.5)
    bad(r"frequency_penalty must be in \[-2.0, 2.0\]", frequency_penalty=-3)
    bad("frequency_penalty must be a finite number", frequency_penalty=float("nan"))
    bad("presence_penalty must be a finite number", presence_penalty="1")
    bad("repetition_penalty must be > 0", repetition_penalty=0)
    bad("repetition_penalty must be a finite number", repetition_penalty=float("inf"))
    bad("logit_bias keys must be token ids", logit_bias={"x": 1})
    bad("logit_bias keys must be token ids", logit_bias={-1: 1})
    bad(r"logit_bias values must be in \[-100.0, 100.0\]", logit_bias={3: 101})
    bad("logit_bias values must be a finite number", logit_bias={3: None})
    bad("logit_bias must be a map", logit_bias=[3])
    p = SamplingParams(presence_penalty=2, frequency_penalty=-2, logit_bias={"3": -100, 4: 100})
    assert p.logit_bias == {3: -100.0, 4: 100.0}  # OpenAI's string keys become ids
    assert pickle.loads(pickle.dumps(p)) == p  # the SSD worker gets them
    with pytest.raises(ValueError, match="outside the vocabulary of 16 tokens: \\[16\\]"):
        build_processors(SamplingParams(logit_bias={16: 1}), [1], TokenVocabulary(16))
    neutral = SamplingParams(
        presence_penalty=0, frequency_penalty=0, repetition_penalty=1, logit_bias={3: 0}
    )
    assert build_processors(neutral, [1], TokenVocabulary(16)) == []  # today's path
    assert build_processors(SamplingParams(), [1], None) == []


# -- the engine hooks -------------------------------------------------------------------------
class ForbidRepeats:
    """A toy processor through the contract only: the token just before a position is
    forbidden there."""

    def process(self, logits, output, drafts):
        history = list(output) + list(drafts)
        out = logits.clone()
        for j in range(out.shape[0]):
            before = history[: len(output) + j]
            if before:
                out[j, before[-1]] = float("-inf")
        return out


@pytest.fixture(scope="module")
def ar(tiny_dirs):
    return LLM(tiny_dirs["v16"], dtype="float32")


@pytest.fixture(scope="module")
def methods(tiny_dirs):
    v16, draft = tiny_dirs["v16"], tiny_dirs["v16_draft"]
    kw = dict(dtype="float32")
    llms = {
        "sd-k3": LLM(v16, draft_model=draft, method="sd", num_speculative_tokens=3, **kw),
        "sd-adaptive": LLM(v16, draft_model=draft, method="sd", **kw),
        "ngram": LLM(v16, method="ngram", num_speculative_tokens=3, **kw),
        "ssd": LLM(v16, draft_model=draft, method="ssd", num_speculative_tokens=2, **kw),
        "ssd-adaptive": LLM(v16, draft_model=draft, method="ssd", **kw),
        # a self-draft with a restricted head (12 of 16 tokens): hits and misses, and the
        # worker's processors see the head's logits expanded to token ids
        "ssd-head": LLM(
            v16, draft_model=v16, method="ssd", num_speculative_tokens=4, draft_vocab=12, **kw
        ),
    }
    yield llms
    for llm in llms.values():
        llm.close()


def test_a_custom_processor_runs_in_every_method(ar, methods, monkeypatch):
    """The contract alone: a processor built for a request changes AR's choice, and every
    method gives AR's tokens with it (greedy). SSD's worker builds only the penalties."""
    assert isinstance(ForbidRepeats(), LogitsProcessor)
    monkeypatch.setattr(sequence, "build_processors", lambda p, ids, v: [ForbidRepeats()])
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = [o.token_ids for o in ar.generate(PROMPTS, params)]
    assert all(a != b for w in want for a, b in zip(w, w[1:]))
    for name, llm in methods.items():
        assert [o.token_ids for o in llm.generate(PROMPTS, params)] == want, name


def test_requests_without_processors_have_none():
    tok = type("Tok", (), {"vocab_size": 16})()
    assert sequence.Sequence([1, 2], SamplingParams(), tok, [2]).processors == []
    seq = sequence.Sequence([1, 2], SamplingParams(presence_penalty=0.5), tok, [2])
    assert [type(p) for p in seq.processors] == [Penalties]
    with pytest.raises(ValueError, match="logit_bias has token ids outside the vocabulary"):
        sequence.Sequence([1, 2], SamplingParams(logit_bias={16: 1.0}), tok, [2])


def _batch(params_of_mode, plain):
    """Every mode on every prompt, and each prompt without processors, in one batch."""
    prompts, params = [], []
    for kw in MODES.values():
        for i, prompt in enumerate(PROMPTS):
            prompts.append(prompt)
            params.append(params_of_mode(kw, i))
    for prompt in PROMPTS:
        prompts.append(prompt)
        params.append(plain)
    return prompts, params


@pytest.mark.parametrize(
    "name", ["sd-k3", "sd-adaptive", "ngram", "ssd", "ssd-adaptive", "ssd-head"]
)
def test_greedy_token_identical_to_ar_in_every_mode(ar, methods, name):
    base = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts, params = _batch(lambda kw, i: dataclasses.replace(base, **kw), base)
    want = [o.token_ids for o in ar.generate(prompts, params)]
    plain = want[-len(PROMPTS) :]
    for m in range(len(MODES)):  # every mode changes some output
        assert want[m * len(PROMPTS) : (m + 1) * len(PROMPTS)] != plain, list(MODES)[m]
    llm = methods[name]
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == want
    assert sum(o.metrics["accepted_tokens"] for o in outs) > 0
    for i, prompt in enumerate(PROMPTS):  # alone as batched
        assert llm.generate([prompt], params[i])[0].token_ids == want[i]


@pytest.mark.parametrize(
    "name", ["sd-k3", "sd-adaptive", "ngram", "ssd", "ssd-adaptive", "ssd-head"]
)
def test_coupled_sampling_gives_the_ar_text_for_a_seed(ar, methods, name):
    """Same seed, same text under penalties: every method's coupled draws are AR's."""
    base = SamplingParams(temperature=0.9, max_tokens=24, ignore_eos=True, sampler="coupled")
    prompts, params = _batch(lambda kw, i: dataclasses.replace(base, seed=i, **kw), base)
    for i in range(1, len(PROMPTS) + 1):  # the rows without processors: seeded too
        params[-i] = dataclasses.replace(base, seed=100 + i)
    want = [o.token_ids for o in ar.generate(prompts, params)]
    got = methods[name].generate(prompts, params)
    assert [o.token_ids for o in got] == want


# -- exactness of sampled output --------------------------------------------------------------
# top-k keeps the continuations few enough that the chi-square test sees many of them (with
# the full 16-token vocabulary 4000 samples fill few cells beyond the first token's); the
# negative presence penalty (more repeats) leaves prompt lookup drafts that get accepted
SAMPLED = {
    "penalties": dict(
        presence_penalty=-1.0, frequency_penalty=0.5, repetition_penalty=1.3, top_k=4
    ),
    "bias": dict(logit_bias={3: 2.5, 5: -1.5, 12: 1.0}, top_k=4, temperature=0.8),
}
N_SAMPLES = 4000


def samples_of(llm, params, n=N_SAMPLES):
    outs = llm.generate([llm.tokenizer.encode(PROMPT)] * n, seeded(params, n))
    eos = llm.eos_token_ids[0]
    return [tuple(o.token_ids) + ((eos,) if o.finish_reason == "stop" else ()) for o in outs]


def exact(tiny_dirs, llm, params):
    prompt = llm.tokenizer.encode(PROMPT)
    return exact_sequence_probs(tiny_dirs["v16"], prompt, params, LENGTH, set(llm.eos_token_ids))


def sampled(setting: str, sampler: str) -> SamplingParams:
    kw = {"temperature": 1.0, **SAMPLED[setting]}
    return SamplingParams(max_tokens=LENGTH, sampler=sampler, **kw)


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


@pytest.mark.parametrize("sampler", ["rejection", "coupled"])
@pytest.mark.parametrize("setting", list(SAMPLED))
def test_ar_follows_the_penalized_distribution(tiny_dirs, ar, setting, sampler):
    params = sampled(setting, sampler)
    probs = exact(tiny_dirs, ar, params)
    off = dict(presence_penalty=None, frequency_penalty=None, repetition_penalty=None)
    plain = exact(tiny_dirs, ar, dataclasses.replace(params, logit_bias=None, **off))
    assert total_variation(probs, plain) > 0.3  # the penalties change the distribution a lot
    assert chi_square_pvalue(samples_of(ar, params), probs) > 1e-3


@pytest.mark.parametrize("sampler", ["rejection", "coupled"])
@pytest.mark.parametrize("setting", list(SAMPLED))
@pytest.mark.parametrize("name", ["sd-k3", "ngram", "ssd"])
def test_speculation_follows_the_penalized_distribution(tiny_dirs, methods, name, setting, sampler):
    llm = methods[name]
    params = sampled(setting, sampler)
    n = N_SAMPLES // 2 if name == "ssd" else N_SAMPLES  # the worker's process is slower
    samples = samples_of(llm, params, n)
    m = llm.metrics()
    assert m["drafted_tokens"] > 300 and 50 < m["accepted_tokens"] < m["drafted_tokens"]
    assert chi_square_pvalue(samples, exact(tiny_dirs, llm, params)) > 1e-3


def test_chi_square_rejects_penalties_that_forget_the_drafts(tiny_dirs, methods, monkeypatch):
    """Power: the same test fails for a verifier whose rows count only the committed output
    (a token drafted earlier in the round is not penalized at the later rows)."""

    def forgetful(logits, seqs, drafts, k):  # every row penalized after the output alone
        bsz, width, vocab = logits.shape
        jobs = [
            Job(s.processors, s.output_ids, [b * width + j for j in range(kb + 1)], [()] * (kb + 1))
            for b, (s, kb) in enumerate(zip(seqs, k.tolist()))
            if s.processors
        ]
        return process_jobs(logits.reshape(-1, vocab), jobs).reshape(logits.shape)

    monkeypatch.setattr(speculative, "process_verify_rows", forgetful)
    llm = methods["sd-k3"]
    params = SamplingParams(
        temperature=1.0, max_tokens=LENGTH, sampler="rejection", presence_penalty=2.0, top_k=3
    )
    samples = samples_of(llm, params)
    assert llm.metrics()["accepted_tokens"] > 500
    assert chi_square_pvalue(samples, exact(tiny_dirs, llm, params)) < 1e-6


# -- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_dirs):
    llm = LLM(tiny_dirs["llama"], dtype="float32")
    with ServerThread(create_app(llm, "tiny", max_num_seqs=4)) as srv:
        yield srv


BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": "1"}, "presence_penalty"),
    ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"logit_bias": {"3": 101}}, "logit_bias"),
    ({"logit_bias": {"w3": 1}}, "logit_bias"),
    ({"logit_bias": {"32": 1}}, "logit_bias"),  # the tiny vocabulary has 32 tokens
    ({"logit_bias": [1, 2]}, "logit_bias"),
]


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
@pytest.mark.parametrize("extra, param", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_penalties_get_400_naming_them(server, route, extra, param):
    if route == "completions":
        body = {"prompt": "w3 w4", "max_tokens": 4, **extra}
    else:
        body = {"messages": [{"role": "user", "content": "w3 w4"}], "max_tokens": 4, **extra}
    r = httpx.post(f"{server.url}/v1/{route}", json=body, timeout=20)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    ok = httpx.post(f"{server.url}/v1/completions", json={"prompt": "w3", "max_tokens": 2})
    assert ok.status_code == 200  # still serving


def test_penalized_request_through_openai_matches_the_python_api(server, tiny_llm):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    kw = dict(presence_penalty=0.7, frequency_penalty=0.4, logit_bias={"5": 4, "9": -100})
    params = SamplingParams(
        temperature=1.0, max_tokens=24, seed=5, ignore_eos=True, repetition_penalty=1.4, **kw
    )
    want = tiny_llm.generate(["w3 w4 w5"], params)[0]
    off = dict(presence_penalty=None, frequency_penalty=None, repetition_penalty=None)
    plain = tiny_llm.generate(["w3 w4 w5"], dataclasses.replace(params, logit_bias=None, **off))[0]
    assert plain.text != want.text
    got = client.completions.create(
        model="tiny",
        prompt="w3 w4 w5",
        max_tokens=24,
        temperature=1.0,
        seed=5,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.4},
        **kw,
    )
    assert got.choices[0].text == want.text
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "w3 w4 w5"}],
        max_tokens=24,
        temperature=1.0,
        seed=5,
        extra_body={"ignore_eos": True, "repetition_penalty": 1.4},
        **kw,
    )
    ids = tiny_llm.chat_prompt([{"role": "user", "content": "w3 w4 w5"}])
    assert chat.choices[0].message.content == tiny_llm.generate([ids], params)[0].text


def test_cli_sampling_flags():
    import argparse

    from specdec.cli.args import add_sampling_args, sampling_from_args

    parser = argparse.ArgumentParser()
    add_sampling_args(parser)
    args = parser.parse_args(
        ["--presence-penalty", "0.5", "--frequency-penalty", "-1", "--repetition-penalty", "1.2"]
        + ["--logit-bias", "5:1.5,7:-100"]
    )
    params = sampling_from_args(args)
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.0)
    assert params.repetition_penalty == 1.2 and params.logit_bias == {5: 1.5, 7: -100.0}
    assert sampling_from_args(parser.parse_args([])).logit_bias is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--logit-bias", "5"])
