"""The OpenAI-compatible server: a real uvicorn server on a free loopback port, driven by the
official openai client and raw httpx. Outputs must equal the Python API's; bad input must
get its 4xx and leave the server serving; disconnects, capacity, auth and engine failure."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import httpx
import openai
import pytest
from server_utils import ServerThread

from specdec import LLM, SamplingParams
from specdec.server.app import create_app

MODEL = "tiny"
KEY = "sekrit-key"
TIMEOUT = 20.0
PROMPTS = ["w3 w4 w5", "w10 w11", "w7 w7 w7 w7 w8 w9", "w20"]


# -- fixtures ----------------------------------------------------------------------------------
def _server(folder, **kw):
    llm = LLM(folder, dtype="float32")
    return llm, ServerThread(create_app(llm, MODEL, **kw))


@pytest.fixture(scope="module")
def server(tiny_dirs):
    llm, srv = _server(tiny_dirs["llama"], max_num_seqs=16, max_waiting=64)
    with srv:
        yield srv


@pytest.fixture(scope="module")
def key_server(tiny_dirs):
    _, srv = _server(tiny_dirs["llama"], api_key=KEY, max_num_seqs=2)
    with srv:
        yield srv


@pytest.fixture(scope="module")
def slow_server(tiny_dirs):
    """One batch row, no waiting queue, and 20 ms per decoding round: a long request stays
    in flight long enough to test disconnects and the full queue."""
    llm, srv = _server(tiny_dirs["llama"], max_num_seqs=1, max_waiting=0)
    round_ = llm.decoder.round

    def slow_round(seqs):
        time.sleep(0.02)
        return round_(seqs)

    llm.decoder.round = slow_round
    with srv:
        yield srv


@pytest.fixture(scope="module")
def ref(tiny_llm):
    """The Python API on the same weights (its own engine, in the test thread)."""
    return tiny_llm


def client(srv, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)


def greedy(ref, prompt, max_tokens, **kw):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, **kw)
    return ref.generate([prompt], params)[0]


def sse_events(lines) -> list:
    """The data payloads of an SSE stream (``[DONE]`` kept as a string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metric(srv, name: str, labels: str = "") -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in /metrics"
    return float(m.group(1))


def wait_until(cond, timeout: float = 10.0, what: str = "condition") -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - t0


def assert_idle(srv) -> None:
    engine = srv.app.state.engine
    wait_until(lambda: engine.num_running == 0 and engine.num_waiting == 0, what="idle engine")
    cache = engine.llm.decoder.cache
    assert cache.free_rows == cache.max_rows


def assert_serving(srv, key: str = "none") -> None:
    r = client(srv, key).completions.create(model=MODEL, prompt="w3", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


# -- completions and chat ----------------------------------------------------------------------
@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_python_api(server, ref, prompt):
    want = greedy(ref, prompt, 20)
    c = client(server)
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    (choice,) = r.choices
    assert choice.text == want.text
    assert choice.finish_reason == want.finish_reason
    n_prompt = len(ref.tokenizer.encode(prompt))
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.total_tokens == n_prompt + len(want.token_ids)
    spec = r.model_dump()["speculative"]
    assert spec["method"] == "ar" and spec["tokens_per_s"] > 0

    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == want.text
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == want.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump(
        include={"prompt_tokens", "completion_tokens", "total_tokens"}
    ) == r.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"})
    assert chunks[-1].model_dump()["speculative"]["method"] == "ar"
    assert all(ch.object == "text_completion" and ch.id == chunks[0].id for ch in chunks)


def test_raw_stream_format(server, ref):
    """SSE framing: ``data: {...}`` events, the last one carrying ``speculative``, then
    ``data: [DONE]``."""
    body = {"model": MODEL, "prompt": "w3 w4", "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = sse_events(raw.split("\n"))
    assert events[-1] == "[DONE]"
    last = events[-2]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["speculative"]["method"] == "ar"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == greedy(ref, "w3 w4", 6).text


def test_chat_greedy_equals_python_api(server, ref):
    messages = [
        {"role": "system", "content": "w5 w6"},
        {"role": "user", "content": "w3 w4 w5"},
    ]
    prompt_ids = ref.chat_prompt(messages)
    want = greedy(ref, prompt_ids, 24)
    c = client(server)
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == want.text
    assert choice.finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.model_dump()["speculative"]["method"] == "ar"

    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=messages, max_completion_tokens=24, temperature=0, stream=True
        )
    )
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason
    assert chunks[-1].model_dump()["speculative"]["method"] == "ar"  # no include_usage

    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert chunks[-1].model_dump()["speculative"]["method"] == "ar"


def test_chat_default_max_tokens_is_the_rest_of_the_context(server, ref):
    messages = [{"role": "user", "content": " ".join(f"w{3 + i % 26}" for i in range(480))}]
    prompt_ids = ref.chat_prompt(messages)
    rest = ref.max_model_len - len(prompt_ids)
    assert 0 < rest < 40
    want = greedy(ref, prompt_ids, rest, ignore_eos=True)
    r = client(server).chat.completions.create(
        model=MODEL, messages=messages, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].message.content == want.text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == rest
    assert r.usage.total_tokens == ref.max_model_len


def test_seeded_sampling_equals_python_api(server, ref):
    c = client(server)

    def python(seed):
        p = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_tokens=20, seed=seed)
        return ref.generate(["w3 w4"], p)[0].text

    kw = dict(model=MODEL, prompt="w3 w4", max_tokens=20, temperature=1.0, top_p=0.9)
    kw["extra_body"] = {"top_k": 20}
    r = c.completions.create(seed=7, **kw)
    assert r.choices[0].text == python(7)
    streamed = "".join(
        ch.choices[0].text for ch in c.completions.create(seed=7, stream=True, **kw) if ch.choices
    )
    assert streamed == python(7)
    # n > 1: independent requests with seeds seed, seed+1, ...
    r = c.completions.create(seed=11, n=3, **kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [python(11), python(12), python(13)]
    assert r.usage.prompt_tokens == 2


def test_chat_n_streaming_indexes_choices(server, ref):
    messages = [{"role": "user", "content": "w3 w4"}]
    prompt_ids = ref.chat_prompt(messages)
    p = [SamplingParams(temperature=1.0, max_tokens=10, seed=s) for s in (5, 6)]
    want = [o.text for o in ref.generate([prompt_ids, prompt_ids], p)]
    chunks = client(server).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, seed=5, n=2, stream=True
    )
    texts = ["", ""]
    roles = set()
    finished = []
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            if c.delta.role:
                roles.add(c.index)
            if c.finish_reason:
                finished.append(c.index)
    assert texts == want
    assert roles == {0, 1} and sorted(finished) == [0, 1]


def test_stop_strings_token_prompts_and_several_prompts(server, ref):
    c = client(server)
    full = greedy(ref, "w3 w4 w5", 12, ignore_eos=True).text
    stop = full.split()[3]
    want = greedy(ref, "w3 w4 w5", 12, ignore_eos=True, stop=[stop])
    kw = dict(model=MODEL, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    r = c.completions.create(prompt="w3 w4 w5", stop=stop, **kw)
    assert r.choices[0].text == want.text and stop not in r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(prompt="w3 w4 w5", stop=[stop], stream=True, **kw)
        if ch.choices
    )
    assert streamed == want.text
    # a prompt of token ids is the same request as its text
    ids = ref.tokenizer.encode("w10 w11")
    assert (
        c.completions.create(prompt=ids, **kw).choices[0].text
        == c.completions.create(prompt="w10 w11", **kw).choices[0].text
    )
    # several prompts: one choice each, in order
    r = c.completions.create(prompt=PROMPTS[:3], **kw)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [
        greedy(ref, p, 12, ignore_eos=True).text for p in PROMPTS[:3]
    ]


def test_32_concurrent_streaming_clients(server, ref):
    prompts = [f"w{3 + i % 26} w{3 + (7 * i) % 26} w{3 + (i // 2) % 26}" for i in range(32)]
    assert len(set(prompts)) == 32
    params = SamplingParams(temperature=0, max_tokens=24)
    want = [o.text for o in ref.generate(prompts, params)]
    engine = server.app.state.engine
    steps0 = engine.steps

    async def one(c: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True
        )
        return "".join([ch.choices[0].text async for ch in stream if ch.choices])

    async def main():
        async with openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=TIMEOUT
        ) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, p) for p in prompts)), timeout=60)

    got = asyncio.run(main())
    assert got == want
    assert engine.steps - steps0 < 32 * 24  # some rounds decoded several requests together
    assert_idle(server)


@pytest.mark.parametrize("method", ["sd", "sd-adaptive", "ngram", "ssd"])
def test_speculative_methods_serve_the_same_text_and_report_acceptance(tiny_dirs, ref, method):
    kw = {"draft_model": tiny_dirs["draft"]} if method.startswith(("sd", "ssd")) else {}
    adaptive = method.endswith("-adaptive")
    kw["num_speculative_tokens"] = None if adaptive else 3
    method = method.removesuffix("-adaptive")
    llm = LLM(tiny_dirs["llama"], method=method, dtype="float32", **kw)
    prompt = "w3 w4 w5 w3 w4 w5 w3 w4"  # repeats: prompt lookup has something to propose
    want = greedy(ref, prompt, 24, ignore_eos=True)  # AR: speculative decoding is lossless
    with llm, ServerThread(create_app(llm, MODEL, max_num_seqs=4)) as srv:
        c = client(srv)
        kw = dict(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        kw["extra_body"] = {"ignore_eos": True}
        r = c.completions.create(**kw)
        assert r.choices[0].text == want.text
        spec = r.model_dump()["speculative"]
        assert spec["method"] == method
        assert 0 <= spec["acceptance_rate"] <= 1 and spec["mean_tokens_per_round"] >= 1
        assert spec["drafted_tokens"] > 0
        if method == "ssd":
            assert 0 <= spec["ssd_hit_rate"] <= 1 and spec["ssd_lookups"] > 0
        usage = {"include_usage": True}
        chunks = list(c.completions.create(stream=True, stream_options=usage, **kw))
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == want.text
        last = chunks[-1].model_dump()["speculative"]
        assert last["method"] == method
        # the adaptive controller may rightly stop drafting on these tiny models (K = 0)
        assert "acceptance_rate" in last or (adaptive and not last.get("drafted_tokens"))
        drafted = metric(srv, "specdec_draft_tokens_total")
        accepted = metric(srv, "specdec_accepted_tokens_total")
        assert drafted > 0
        assert metric(srv, "specdec_acceptance_rate") == pytest.approx(accepted / drafted)
        if method == "ssd":
            assert 0 <= metric(srv, "specdec_ssd_hit_rate") <= 1
        assert_seeded_text_equals_ar(c, ref, prompt)
        assert_idle(srv)


def assert_seeded_text_equals_ar(c, ref, prompt):
    """Same seed, same text: a sampled request gives AR's text through the server whatever the
    method (the coupled sampler), in completions and chat, streamed or not, with n > 1."""

    def python(prompt_ids, seed, **kw):
        p = SamplingParams(temperature=0.8, max_tokens=16, seed=seed, ignore_eos=True, **kw)
        return ref.generate([prompt_ids], p)[0].text

    kw = dict(model=MODEL, max_tokens=16, temperature=0.8, extra_body={"ignore_eos": True})
    prompt_ids = ref.tokenizer.encode(prompt)
    for seed in (0, 1, 2):
        r = c.completions.create(prompt=prompt, seed=seed, n=2, top_p=0.9, **kw)
        assert [ch.text for ch in r.choices] == [
            python(prompt_ids, s, top_p=0.9) for s in (seed, seed + 1)
        ]
        chunks = c.completions.create(prompt=prompt, seed=seed, stream=True, top_p=0.9, **kw)
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == r.choices[0].text
    messages = [{"role": "user", "content": prompt}]
    chat_ids = ref.chat_prompt(messages)
    r = c.chat.completions.create(messages=messages, seed=5, **kw)
    assert r.choices[0].message.content == python(chat_ids, 5)
    chunks = c.chat.completions.create(messages=messages, seed=5, stream=True, **kw)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == python(chat_ids, 5)


def test_ssd_and_aggregate_metrics():
    """SSD hit rates reach /metrics and the ``speculative`` object (no SSD server needed)."""
    from specdec.metrics import RequestMetrics, SpeculationMetrics, SSDMetrics
    from specdec.server.metrics import ServerMetrics, speculative_info

    def request(generated, wall, accepted, hist, hit):
        spec = SpeculationMetrics(
            drafted_tokens=12,
            accepted_tokens=accepted,
            judged_tokens=12,
            acceptance_rate=accepted / 12,
            per_token_acceptance=accepted / 12,
            mean_tokens_per_round=(accepted + 4) / 4,
            per_position_acceptance=[],
            accepted_length_histogram=hist,
            draft_time_s=0.1,
            verify_time_s=0.2,
            other_time_s=0.0,
        )
        ssd = SSDMetrics(hit, {1: hit}, 4, 0.0, 0.0, 0, 0, 0)
        speed = generated / wall
        return RequestMetrics("ssd", 3, generated, wall, speed, 4, 5, speculation=spec, ssd=ssd)

    per_request = [request(10, 1.0, 6, {1: 2, 2: 2}, 0.5), request(20, 2.0, 12, {3: 4}, 1.0)]
    m = ServerMetrics()
    for pr in per_request:
        m.finished(pr)
    text = m.render().decode()
    assert "specdec_ssd_hit_rate 0.75" in text
    assert 'specdec_ssd_metric{key="ssd_lookups"} 4.0' in text
    assert "specdec_acceptance_rate 0.75" in text
    one = speculative_info(per_request[:1], "ssd")
    assert one["ssd_hit_rate"] == 0.5 and one["ssd_hit_rate_by_k"] == {1: 0.5}
    assert one["acceptance_rate"] == 0.5 and one["mean_tokens_per_round"] == 2.5
    both = speculative_info(per_request, "ssd")
    assert both["acceptance_rate"] == 18 / 24
    assert both["mean_tokens_per_round"] == (18 + 8) / 8
    assert both["ssd_hit_rate"] == 0.75
    assert both["tokens_per_s"] == 30 / 2.0


# -- bad input ---------------------------------------------------------------------------------
LONG = " ".join(["w3"] * 600)
BAD = [
    # (route, body (bytes or JSON), status, param, code)
    ("completions", b'{"model": "tiny", "prompt": "w3"', 400, None, "invalid_json"),
    ("completions", b"not json at all", 400, None, "invalid_json"),
    ("completions", [1, 2], 400, None, None),
    ("completions", {"model": MODEL}, 400, "prompt", None),
    ("completions", {"prompt": 3}, 400, "prompt", None),
    ("completions", {"prompt": "w3", "temperature": "hot"}, 400, "temperature", None),
    ("completions", {"prompt": "w3", "max_tokens": "5"}, 400, "max_tokens", None),
    ("completions", {"prompt": "w3", "max_tokens": 2.5}, 400, "max_tokens", None),
    ("completions", {"prompt": "w3", "stream": "yes"}, 400, "stream", None),
    ("completions", {"prompt": "w3", "seed": True}, 400, "seed", None),
    ("completions", {"prompt": "w3", "stop": 5}, 400, "stop", None),
    ("completions", {"prompt": "w3", "temperature": -1}, 400, "temperature", None),
    ("completions", {"prompt": "w3", "top_p": 0}, 400, "top_p", None),
    ("completions", {"prompt": "w3", "top_p": 1.5}, 400, "top_p", None),
    ("completions", {"prompt": "w3", "top_k": -3}, 400, "top_k", None),
    ("completions", {"prompt": "w3", "max_tokens": 0}, 400, "max_tokens", None),
    ("completions", {"prompt": "w3", "max_tokens": -5}, 400, "max_tokens", None),
    ("completions", {"prompt": "w3", "n": 0}, 400, "n", None),
    ("completions", {"prompt": "w3", "stop": [""]}, 400, "stop", None),
    ("completions", {"prompt": "w3", "model": "gpt-4"}, 404, "model", "model_not_found"),
    ("completions", {"prompt": LONG}, 400, "prompt", "context_length_exceeded"),
    ("completions", {"prompt": "w3", "max_tokens": 100000}, 400, "prompt", None),
    ("completions", {"prompt": ""}, 400, "prompt", None),
    ("completions", {"prompt": []}, 400, "prompt", None),
    ("completions", {"prompt": [1, 99]}, 400, "prompt", None),
    ("completions", {"prompt": "w3", "logprobs": 6}, 400, "logprobs", "invalid_value"),
    ("completions", {"prompt": "w3", "logprobs": -1}, 400, "logprobs", "invalid_value"),
    ("completions", {"prompt": "w3", "logprobs": True}, 400, "logprobs", None),
    ("completions", {"prompt": "w3", "echo": "yes"}, 400, "echo", None),
    ("completions", {"prompt": "w3", "max_tokens": 0, "echo": False}, 400, "max_tokens", None),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w3"}], "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "invalid_value",
    ),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w3"}], "top_logprobs": 2},
        400,
        "top_logprobs",
        "invalid_value",
    ),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w3"}], "logprobs": 1},
        400,
        "logprobs",
        None,
    ),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w3"}], "max_tokens": 0},
        400,
        "max_tokens",
        None,
    ),
    ("chat/completions", {"messages": []}, 400, "messages", None),
    ("chat/completions", {"messages": "hi"}, 400, "messages", None),
    ("chat/completions", {"messages": [{"role": "wizard", "content": "w3"}]}, 400, None, None),
    ("chat/completions", {"messages": [{"content": "w3"}]}, 400, "messages", None),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w3"}], "model": "nope"},
        404,
        "model",
        "model_not_found",
    ),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": LONG}]},
        400,
        "messages",
        "context_length_exceeded",
    ),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w3"}], "temperature": -1},
        400,
        "temperature",
        None,
    ),
    ("completions", b"x" * (2 << 20), 413, None, "request_too_large"),
    ("completions", {"prompt": "w3 " * 400_000}, 413, None, "request_too_large"),
]


@pytest.mark.parametrize(
    "route,body,status,param,code",
    BAD,
    ids=[f"{i}-{b[0].split('/')[0]}-{b[2]}-{b[3] or b[4] or ''}" for i, b in enumerate(BAD)],
)
def test_bad_input_gets_4xx_and_server_keeps_serving(server, route, body, status, param, code):
    invalid0 = metric(server, "specdec_requests_total", '{status="invalid"}')
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        f"{server.url}/v1/{route}",
        content=content,
        headers={"content-type": "application/json"},
        timeout=TIMEOUT,
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param or (err["param"] or "").startswith(param), err
    assert isinstance(err["code"], str) and err["code"], err  # every error names its kind
    if code is not None:
        assert err["code"] == code
    assert metric(server, "specdec_requests_total", '{status="invalid"}') == invalid0 + 1
    assert_serving(server)


def test_openai_client_raises_typed_errors(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="w3", temperature=-1)
    assert "temperature" in e.value.message
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "w3"}])
    r = httpx.get(f"{server.url}/v1/nothing-here", timeout=TIMEOUT)
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(f"{server.url}/v1/completions", timeout=TIMEOUT)
    assert r.status_code == 405 and "error" in r.json()
    assert_serving(server)


# -- disconnects and capacity ------------------------------------------------------------------
LONG_REQUEST = {
    "model": MODEL,
    "prompt": "w3 w4",
    "max_tokens": 400,  # 400 rounds of 20 ms: 8 s if nobody stops it
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


def first_chunk(lines) -> dict:
    """The first SSE chunk from the iterator ``lines`` (``resp.iter_lines()``). Keep the
    iterator: closing it (a ``for`` loop left early) closes the connection."""
    for line in lines:
        if line.startswith("data: "):
            return json.loads(line[6:])
    raise AssertionError("the stream ended before its first chunk")


def test_client_disconnect_mid_stream_frees_the_request(slow_server):
    engine = slow_server.app.state.engine
    aborted0 = metric(slow_server, "specdec_requests_total", '{status="aborted"}')
    t0 = time.monotonic()
    url = f"{slow_server.url}/v1/completions"
    with httpx.stream("POST", url, json=LONG_REQUEST, timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        assert first_chunk(lines)["choices"][0]["text"]
        time.sleep(0.3)
        assert engine.num_running == 1 and engine.num_in_flight == 1  # still going
        # leaving the block closes the connection mid-stream
    # the client closed the connection: the request must be aborted and its row freed
    wait_until(
        lambda: metric(slow_server, "specdec_num_requests_running") == 0,
        what="running requests to drop to 0",
    )
    assert time.monotonic() - t0 < 6  # well before the 8 s the request would take
    assert_idle(slow_server)
    wait_until(
        lambda: metric(slow_server, "specdec_requests_total", '{status="aborted"}') == aborted0 + 1,
        what="the abort to be counted",
    )
    assert engine.num_in_flight == 0
    assert_serving(slow_server)


def test_client_disconnect_while_waiting_non_streamed(slow_server):
    body = dict(LONG_REQUEST, stream=False)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{slow_server.url}/v1/completions", json=body, timeout=0.5)
    elapsed = wait_until(lambda: slow_server.app.state.engine.num_in_flight == 0, what="abort")
    assert elapsed < 5  # the request alone would take 8 s
    assert_idle(slow_server)
    assert_serving(slow_server)


def test_full_queue_answers_429(slow_server):
    engine = slow_server.app.state.engine
    rejected0 = metric(slow_server, "specdec_requests_total", '{status="rejected"}')
    url = f"{slow_server.url}/v1/completions"
    with httpx.stream("POST", url, json=LONG_REQUEST, timeout=TIMEOUT) as resp:
        lines = resp.iter_lines()
        first_chunk(lines)
        assert engine.num_in_flight == 1
        r = httpx.post(url, json={"model": MODEL, "prompt": "w5", "max_tokens": 2}, timeout=TIMEOUT)
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"  # seconds (RFC 9110)
        err = r.json()["error"]
        assert err["type"] == "rate_limit_error" and "queue" in err["message"]
        assert err["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            client(slow_server).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "w3"}], max_tokens=2
            )
    assert metric(slow_server, "specdec_requests_total", '{status="rejected"}') == rejected0 + 2
    assert_idle(slow_server)
    assert_serving(slow_server)


# -- auth, models, health, metrics -------------------------------------------------------------
def test_api_key_is_enforced(key_server):
    url = key_server.url
    for path in ("/v1/models", "/metrics"):
        r = httpx.get(url + path, timeout=TIMEOUT)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"  # RFC 6750: no key sent
        r = httpx.get(url + path, headers={"Authorization": "Bearer wrong"}, timeout=TIMEOUT)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "w3"}, timeout=TIMEOUT)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        client(key_server, "wrong").completions.create(model=MODEL, prompt="w3", max_tokens=2)
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).json() == {"status": "ok"}
    assert_serving(key_server, KEY)
    r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT)
    assert r.status_code == 200 and "specdec_requests_total" in r.text


def test_models_health_and_metrics(server):
    url = server.url
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert httpx.get(f"{url}/v1/models/{MODEL}", timeout=TIMEOUT).json()["id"] == MODEL
    assert httpx.get(f"{url}/v1/models/other", timeout=TIMEOUT).status_code == 404
    r = httpx.get(f"{url}/health", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json() == {"status": "ok"}

    ok0 = metric(server, "specdec_requests_total", '{status="success"}')
    gen0 = metric(server, "specdec_generation_tokens_total")
    prompt0 = metric(server, "specdec_prompt_tokens_total")
    lat0 = metric(server, "specdec_request_latency_seconds_count")
    ttft0 = metric(server, "specdec_time_to_first_token_seconds_count")
    client(server).completions.create(
        model=MODEL, prompt="w3 w4 w5", max_tokens=7, extra_body={"ignore_eos": True}
    )
    assert metric(server, "specdec_requests_total", '{status="success"}') == ok0 + 1
    assert metric(server, "specdec_generation_tokens_total") == gen0 + 7
    assert metric(server, "specdec_prompt_tokens_total") == prompt0 + 3
    assert metric(server, "specdec_request_latency_seconds_count") == lat0 + 1
    assert metric(server, "specdec_time_to_first_token_seconds_count") == ttft0 + 1
    assert metric(server, "specdec_num_requests_running") == 0
    assert metric(server, "specdec_num_requests_waiting") == 0
    assert metric(server, "specdec_engine_alive") == 1
    assert metric(server, "specdec_acceptance_rate") == 0  # AR drafts nothing
    assert metric(server, "specdec_ssd_hit_rate") == 0


# -- engine failure ----------------------------------------------------------------------------
def test_engine_failure_fails_requests_with_500_and_health_503(tiny_dirs, caplog):
    llm = LLM(tiny_dirs["llama"], dtype="float32")
    fail = threading.Event()
    round_ = llm.decoder.round

    def flaky_round(seqs):
        time.sleep(0.005)
        if fail.is_set():
            raise RuntimeError("boom: simulated kernel failure")
        return round_(seqs)

    llm.decoder.round = flaky_round
    with ServerThread(create_app(llm, MODEL)) as srv, httpx.Client(timeout=TIMEOUT) as http:
        assert http.get(f"{srv.url}/health").status_code == 200
        result = {}

        def non_streamed():
            body = dict(LONG_REQUEST, stream=False)
            result["r"] = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=TIMEOUT)

        t = threading.Thread(target=non_streamed)
        with http.stream("POST", f"{srv.url}/v1/completions", json=LONG_REQUEST) as resp:
            lines = resp.iter_lines()
            first_chunk(lines)
            t.start()
            wait_until(lambda: srv.app.state.engine.num_in_flight == 2, what="both requests")
            fail.set()
            events = sse_events(lines)
        t.join(TIMEOUT)
        assert "error" in events[-1] and "boom" in events[-1]["error"]["message"]
        r = result["r"]
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        r = http.get(f"{srv.url}/health")
        assert r.status_code == 503 and "boom" in r.json()["error"]
        r = http.post(f"{srv.url}/v1/completions", json={"prompt": "w3", "max_tokens": 2})
        assert r.status_code == 503
        assert metric(srv, "specdec_engine_alive") == 0
    assert any("engine thread failed" in rec.message for rec in caplog.records)


# -- the command line --------------------------------------------------------------------------
def test_serve_args(monkeypatch):
    from specdec.cli import build_parser

    monkeypatch.setenv("SPECDEC_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "--model", "m"])
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 8000, "from-env")
    assert (args.max_num_seqs, args.max_waiting, args.max_model_len) == (16, 64, None)
    assert args.method == "ar" and args.dtype == "auto"
    assert (args.header_timeout, args.body_timeout) == (30.0, 60.0)


POST_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + KEY.encode()
    + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
)


def test_specdec_serve_command(tiny_dirs, monkeypatch):
    """``specdec serve`` through the CLI entry point; uvicorn.run is swapped for the same real
    server on a free port (no fixed port, no subprocess), and queried while it runs."""
    import uvicorn

    from specdec.cli import main

    folder = str(tiny_dirs["llama"])
    seen = {}

    def run(app, host, port, http, **kw):
        seen.update(host=host, port=port)
        with ServerThread(app, http=http) as srv:  # the protocol serve chose: its deadline
            # headers, then a body, that never finish: each gets its 408 after --*-timeout
            for partial in (b"GET /health HTTP/1.1\r\nHost: x", POST_HEAD + b"{"):
                with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
                    sock.sendall(partial)
                    t0 = time.monotonic()
                    assert sock.recv(12) == b"HTTP/1.1 408"
                    seen.setdefault("timeouts", []).append(time.monotonic() - t0)
            assert httpx.get(f"{srv.url}/health", timeout=TIMEOUT).status_code == 200
            assert httpx.get(f"{srv.url}/v1/models", timeout=TIMEOUT).status_code == 401
            c = client(srv, KEY)
            seen["models"] = [m.id for m in c.models.list().data]
            r = c.chat.completions.create(
                model=folder,
                messages=[{"role": "user", "content": "w3 w4"}],
                max_tokens=5,
                temperature=0,
            )
            seen["finish"] = r.choices[0].finish_reason
            seen["max_model_len"] = srv.app.state.engine.max_model_len

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.setenv("SPECDEC_API_KEY", KEY)
    argv = ["serve", "--model", folder, "--dtype", "float32", "--port", "8123"]
    argv += ["--header-timeout", "0.5", "--body-timeout", "0.5"]
    assert main(argv + ["--max-num-seqs", "2", "--max-model-len", "128"]) == 0
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8123)
    assert all(0.4 < t < 4 for t in seen["timeouts"]), seen["timeouts"]
    assert seen["models"] == [folder]
    assert seen["finish"] in ("stop", "length")
    assert seen["max_model_len"] == 128
