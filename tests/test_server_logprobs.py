"""Logprobs through the OpenAI-compatible server, with the official openai client against a
real uvicorn server for every method: completions' legacy shape (streamed and not, echo with
the prompt's logprobs, max_tokens 0 for pure scoring) and chat's ``logprobs.content`` equal
the Python API's scores of the same text."""

from __future__ import annotations

import openai
import pytest
from server_utils import ServerThread

from specdec import LLM, SamplingParams
from specdec.server.app import create_app

MODEL = "tiny"
TOL = 1e-4
PROMPT = "w3 w4 w5 w3 w4 w5 w3 w4"  # repeats: prompt lookup has something to propose
SETTINGS = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.8, top_p=0.9, seed=7),  # seeded: coupled, the same text
}


@pytest.fixture(scope="module", params=["ar", "sd", "ngram", "ssd"])
def served(request, tiny_dirs):
    method = request.param
    kw = {"draft_model": tiny_dirs["draft"]} if method in ("sd", "ssd") else {}
    if method != "ar":
        kw["num_speculative_tokens"] = 3
    llm = LLM(tiny_dirs["llama"], method=method, dtype="float32", **kw)
    with llm, ServerThread(create_app(llm, MODEL, max_num_seqs=4)) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def ref(tiny_llm):
    return tiny_llm


def token_id(ref, text: str) -> int:
    ids = ref.tokenizer.hf.convert_tokens_to_ids([text])
    assert ref.tokenizer.token_text(ids[0]) == text
    return ids[0]


def params_of(setting: str) -> SamplingParams:
    kw = dict(SETTINGS[setting])
    kw.pop("seed", None)
    return SamplingParams(**kw)


def assert_legacy_equals(ref, lp: dict, scored, top_n: int) -> None:
    """A legacy logprobs object against a ScoreOutput over the same tokens: each token's
    logprob, its alternatives (the top ``top_n`` and the chosen token, text -> logprob) and
    offsets that advance by each token's text."""
    assert [token_id(ref, t) for t in lp["tokens"]] == scored.token_ids
    for j, (got, want) in enumerate(zip(lp["token_logprobs"], scored.logprobs)):
        top = lp["top_logprobs"][j]
        if want is None:  # an echoed prompt's first token
            assert got is None and top is None
            continue
        assert got == pytest.approx(want, abs=TOL)
        best = {ref.tokenizer.token_text(t): v for t, v in scored.top_logprobs[j][:top_n]}
        assert set(top) == set(best) | {lp["tokens"][j]}
        assert top == pytest.approx({**best, lp["tokens"][j]: want}, abs=TOL)
    start = lp["text_offset"][0]
    assert lp["text_offset"] == [
        start + len("".join(lp["tokens"][:j])) for j in range(len(lp["tokens"]))
    ]


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_completion_logprobs_equal_the_python_scores(served, ref, setting):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=12, logprobs=3, **SETTINGS[setting])
    kw["extra_body"] = {"ignore_eos": True}
    r = served.completions.create(**kw)
    lp = r.choices[0].logprobs.model_dump()
    ids = [token_id(ref, t) for t in lp["tokens"]]
    assert len(ids) == 12
    (score,) = ref.score([PROMPT], [ids], top_logprobs=3, sampling_params=params_of(setting))
    assert_legacy_equals(ref, lp, score, 3)
    # streamed: the same tokens and values, piece by piece
    chunks = list(served.completions.create(stream=True, **kw))
    pieces = [c.choices[0].logprobs.model_dump() for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert sum((p[key] for p in pieces), []) == lp[key], key


def test_echo_with_max_tokens_0_scores_the_prompt(served, ref):
    """What lm-eval sends for a loglikelihood (with max_tokens 1): the prompt's logprobs."""
    (score,) = ref.score([PROMPT], top_logprobs=2)
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2, temperature=0)
    r = served.completions.create(**kw)
    choice = r.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    lp = choice.logprobs.model_dump()
    assert_legacy_equals(ref, lp, score, 2)
    assert lp["text_offset"][0] == 0
    # one generated token after the echoed prompt, as lm-eval asks: the prompt's entries, then
    # the greedy token's
    ids = ref.tokenizer.encode(PROMPT)
    r = served.completions.create(**{**kw, "max_tokens": 1, "prompt": ids})
    lp1 = r.choices[0].logprobs.model_dump()
    assert r.choices[0].text.startswith(ref.tokenizer.decode(ids))
    assert lp1["token_logprobs"][0] is None
    assert lp1["token_logprobs"][1:-1] == pytest.approx(lp["token_logprobs"][1:], abs=TOL)
    nxt = ref.generate([ids], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0]
    (tail,) = ref.score([ids], [nxt.token_ids])
    assert lp1["token_logprobs"][-1] == pytest.approx(tail.logprobs[0], abs=TOL)
    # streamed: the echo comes first, with the prompt's entries
    chunks = [c for c in served.completions.create(stream=True, **kw) if c.choices]
    assert chunks[0].choices[0].text == PROMPT
    assert chunks[0].choices[0].logprobs.model_dump() == lp


def test_echo_without_logprobs_prepends_the_prompt(served, ref):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True)
    r = served.completions.create(**kw)
    want = ref.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5))[0]
    assert r.choices[0].text == PROMPT + want.text and r.choices[0].logprobs is None


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_chat_logprobs_equal_the_python_scores(served, ref, setting):
    messages = [{"role": "user", "content": PROMPT}]
    kw = dict(model=MODEL, messages=messages, max_tokens=10, logprobs=True, top_logprobs=3)
    kw.update(SETTINGS[setting], extra_body={"ignore_eos": True})
    r = served.chat.completions.create(**kw)
    content = [e.model_dump() for e in r.choices[0].logprobs.content]
    ids = [token_id(ref, e["token"]) for e in content]
    assert len(ids) == 10
    (score,) = ref.score(
        [ref.chat_prompt(messages)], [ids], top_logprobs=3, sampling_params=params_of(setting)
    )
    for e, lp, top in zip(content, score.logprobs, score.top_logprobs):
        assert e["logprob"] == pytest.approx(lp, abs=TOL)
        assert bytes(e["bytes"]) == e["token"].encode()
        assert [token_id(ref, t["token"]) for t in e["top_logprobs"]] == [t for t, _ in top]
        assert [t["logprob"] for t in e["top_logprobs"]] == pytest.approx(
            [v for _, v in top], abs=TOL
        )
    chunks = list(served.chat.completions.create(stream=True, **kw))
    streamed = [
        e.model_dump()
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert streamed == content
    no_logprobs = served.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": 0})
    assert no_logprobs.choices[0].logprobs is None
    assert no_logprobs.choices[0].message.content == r.choices[0].message.content
