"""The server's answers to hostile or broken clients, on a real uvicorn server with the header
deadline that ``specdec serve`` uses: text that is not Unicode, too many prompts, an internal
error, and clients that send their headers or body a byte at a time. Each answer is an
OpenAI-style error with a ``code``, nothing is logged as a traceback for bad input, and the
client's keep-alive connection (or, for slow clients, the server) keeps serving."""

from __future__ import annotations

import json
import logging
import re
import socket
import time

import httpx
import pytest
from server_utils import ServerThread

from specdec import LLM
from specdec.server import create_app, http_protocol

MODEL = "tiny"
TIMEOUT = 20.0
HEADER_S = 1.0  # the deadlines of the test server (the defaults are 30 s and 60 s)
BODY_S = 1.0
RUNNING, WAITING = 4, 4


@pytest.fixture(scope="module")
def server(tiny_dirs):
    llm = LLM(tiny_dirs["llama"], dtype="float32")
    app = create_app(llm, MODEL, max_num_seqs=RUNNING, max_waiting=WAITING, body_timeout_s=BODY_S)
    with ServerThread(app, http=http_protocol(HEADER_S)) as srv:
        yield srv


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def errors(self) -> list[logging.LogRecord]:
        return [r for r in self.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.fixture
def logged():
    """What the app and uvicorn log while the test runs (uvicorn's loggers do not propagate
    to the root logger, so caplog would not see them)."""
    handler = Records()
    names = ("specdec.server", "uvicorn.error", "uvicorn")
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in names:
        logging.getLogger(name).removeHandler(handler)


def local_port(r: httpx.Response) -> int:
    """The client's side of the connection that carried ``r``: equal ports, one connection."""
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def post_raw(http: httpx.Client, url: str, route: str, body: str) -> httpx.Response:
    """POST a JSON text as it is (``json.dumps`` would escape a lone surrogate the same way,
    but the point is to show the bytes a client sends)."""
    return http.post(
        f"{url}/v1/{route}", content=body.encode(), headers={"content-type": "application/json"}
    )


def good_request(http: httpx.Client, url: str) -> httpx.Response:
    r = http.post(f"{url}/v1/completions", json={"prompt": "w3", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    return r


# -- text that is not Unicode ------------------------------------------------------------------
CHAT = '"messages": [{"role": "user", "content": "w3"}], "max_tokens": 2'
SURROGATES = [
    # (route, JSON body with a lone surrogate escaped as JSON does, status, param, in message)
    ("completions", '{"prompt": "a\\ud800b"}', 400, "prompt", "prompt is not valid Unicode"),
    ("completions", '{"prompt": ["w3", "a\\udc00"]}', 400, "prompt", "prompt 1 is not valid"),
    ("completions", '{"prompt": "a\\ud800b", "stream": true}', 400, "prompt", "surrogate"),
    ("completions", '{"prompt": "w3", "stop": ["x", "\\ud800"]}', 400, "stop", "stop must be"),
    ("completions", '{"prompt": "w3", "stop": "\\udfff"}', 400, "stop", "surrogate"),
    ("completions", '{"prompt": "w3", "model": "a\\ud800"}', 404, "model", "'a\\ud800'"),
    (
        "chat/completions",
        '{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
        400,
        "messages",
        "messages[0].content is not valid Unicode",
    ),
    (
        "chat/completions",
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
        400,
        "messages",
        "messages[0].content",
    ),
    (
        "chat/completions",
        '{"messages": [{"role": "user", "content": "w3", "name": "\\ud800"}]}',
        400,
        "messages",
        "messages[0].name",
    ),
    (
        "chat/completions",
        '{"messages": [{"role": "user", "content": "a\\ud800"}], "stream": true}',
        400,
        "messages",
        "surrogate",
    ),
    ("chat/completions", "{" + CHAT + ', "stop": ["\\ud800"]}', 400, "stop", "surrogate"),
]


@pytest.mark.parametrize(
    "route,body,status,param,says",
    SURROGATES,
    ids=[f"{i}-{s[3]}" for i, s in enumerate(SURROGATES)],
)
def test_lone_surrogate_is_a_4xx_and_the_connection_keeps_serving(
    server, logged, route, body, status, param, says
):
    with httpx.Client(timeout=TIMEOUT) as http:
        first = good_request(http, server.url)
        r = post_raw(http, server.url, route, body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error"
        assert err["param"] == param and err["code"] in ("invalid_value", "model_not_found")
        assert says in err["message"], err["message"]
        assert r.headers.get("connection", "").lower() != "close"
        after = good_request(http, server.url)
        # the same keep-alive connection carried all three (it was not reset)
        assert local_port(first) == local_port(r) == local_port(after)
    assert logged.errors() == []  # bad input is no server error: no traceback


def test_python_api_names_the_bad_text(tiny_llm):
    from specdec import SamplingParams

    with pytest.raises(
        ValueError, match=r"prompt 0 is not valid Unicode.*U\+D800\) at character 1"
    ):
        tiny_llm.generate(["a\ud800b"], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"messages\[1\]\.content is not valid Unicode"):
        tiny_llm.chat_prompt(
            [{"role": "user", "content": "w3"}, {"role": "user", "content": "\udc00"}]
        )
    with pytest.raises(ValueError, match="stop must be valid Unicode"):
        SamplingParams(stop="\ud800")
    # real Unicode is fine (ignore_eos: an unseeded sample may draw EOS first, 1 run in ~30)
    out = tiny_llm.generate(["w3 \u00e9\U0001f600"], SamplingParams(max_tokens=2, ignore_eos=True))
    assert len(out[0].token_ids) == 2


# -- an internal error -------------------------------------------------------------------------
def test_internal_error_is_one_traceback_and_the_connection_keeps_serving(
    server, logged, monkeypatch
):
    llm = server.app.state.llm
    make_request = llm.make_request

    def failing(prompt, *args, **kw):
        if prompt == "w31":
            raise RuntimeError("simulated bug")
        return make_request(prompt, *args, **kw)

    monkeypatch.setattr(llm, "make_request", failing)
    with httpx.Client(timeout=TIMEOUT) as http:
        first = good_request(http, server.url)
        r = http.post(f"{server.url}/v1/completions", json={"prompt": "w31", "max_tokens": 2})
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "internal_error"
        assert "RuntimeError: simulated bug" in err["message"]
        after = good_request(http, server.url)
        assert local_port(first) == local_port(r) == local_port(after)
    errors = logged.errors()
    assert len(errors) == 1, [r.getMessage() for r in errors]  # one traceback, not two
    assert errors[0].name == "specdec.server" and errors[0].exc_info[0] is RuntimeError


# -- limits, and a code on every error ---------------------------------------------------------
def test_too_many_prompts_blame_the_prompt_and_say_the_limit(server):
    capacity = RUNNING + WAITING
    url = f"{server.url}/v1/completions"
    body = {"prompt": ["w3"] * 100, "max_tokens": 2}
    r = httpx.post(url, json=body, timeout=TIMEOUT)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt" and err["code"] == "invalid_value"
    msg = err["message"]
    assert msg.startswith("100 prompts exceed the server's capacity of 8 sequences")
    assert f"({RUNNING} decoded together + {WAITING} waiting)" in msg
    assert f"at most {capacity} prompts per request" in msg
    # within the capacity in prompts, beyond it with n: n's fault, and how many fit
    r = httpx.post(url, json={"prompt": ["w3"] * 3, "n": 3, "max_tokens": 2}, timeout=TIMEOUT)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "n" and err["code"] == "invalid_value"
    assert "3 prompts x n=3 = 9 choices exceed" in err["message"]
    assert "at most n=2" in err["message"]
    r = httpx.post(url, json={"prompt": "w3", "n": 9, "max_tokens": 2}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    # exactly the capacity is accepted: one choice per prompt, in order
    r = httpx.post(url, json={"prompt": ["w3"] * capacity, "max_tokens": 2}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == list(range(capacity))


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("POST", "/v1/completions", {"prompt": "w3", "n": 0}),
        ("POST", "/v1/completions", {"prompt": "w3", "n": 1000}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "w3"}], "n": 9}),
        ("POST", "/v1/completions", {"prompt": "w3", "top_k": -2}),
        ("POST", "/v1/completions", {"prompt": [[1, 2], [99]]}),
        ("GET", "/v1/models/other", None),
        ("GET", "/nowhere", None),
        ("DELETE", "/v1/completions", None),
    ],
)
def test_every_error_has_a_code(server, method, path, body):
    r = httpx.request(method, server.url + path, json=body, timeout=TIMEOUT)
    assert 400 <= r.status_code < 500
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["code"], str) and err["code"], err


# -- slow clients ------------------------------------------------------------------------------
def open_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


def trickle(sock: socket.socket, data: bytes, every: float, limit: float) -> tuple[float, bytes]:
    """Send ``data`` a byte every ``every`` seconds until the server closes the connection (or
    ``limit`` seconds pass); how long the connection stayed open, and what the server sent."""
    t0 = time.monotonic()
    got = b""
    sock.settimeout(every)
    for byte in data:
        if time.monotonic() - t0 > limit:
            break
        try:
            sock.sendall(bytes([byte]))
        except OSError:  # closed by the server
            return time.monotonic() - t0, got
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0, got
        if not chunk:
            return time.monotonic() - t0, got
        got += chunk
    return time.monotonic() - t0, got


SLOW_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 400


def test_uvicorn_alone_waits_for_headers_forever(tiny_dirs):
    """Why the deadline exists: plain uvicorn, even with a 1 s keep-alive timeout, keeps a
    connection whose headers trickle in open (here 2.5 s, for as long as the client likes)."""
    from fastapi import FastAPI

    with ServerThread(FastAPI(), timeout_keep_alive=1) as srv, open_socket(srv.url) as sock:
        held, got = trickle(sock, SLOW_HEAD, every=0.1, limit=2.5)
    assert held > 2.5 and got == b""


def test_headers_sent_a_byte_at_a_time_are_cut_off(server):
    with open_socket(server.url) as sock:
        held, got = trickle(sock, SLOW_HEAD, every=0.1, limit=10 * HEADER_S)
    assert HEADER_S * 0.9 <= held < HEADER_S + 3, held
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    # a client that connects and sends nothing is dropped too, silently
    with open_socket(server.url) as sock:
        sock.settimeout(HEADER_S + 3)
        t0 = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - t0 >= HEADER_S * 0.9
    # the deadline is per request: a keep-alive connection's next request has its own
    with httpx.Client(timeout=TIMEOUT) as http:
        first = good_request(http, server.url)
        time.sleep(HEADER_S * 1.5)  # idle longer than the header deadline, within keep-alive
        after = good_request(http, server.url)
        assert local_port(first) == local_port(after)


def invalid_requests(srv) -> float:
    text = httpx.get(f"{srv.url}/metrics", timeout=TIMEOUT).text
    m = re.search(r'^specdec_requests_total\{status="invalid"\} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


def test_body_sent_a_byte_at_a_time_gets_408(server):
    invalid0 = invalid_requests(server)
    body = json.dumps({"prompt": "w3 " * 200, "max_tokens": 2}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with open_socket(server.url) as sock:
        sock.sendall(head + body[:10])
        held, got = trickle(sock, body[10:], every=0.1, limit=10 * BODY_S)
        sock.settimeout(TIMEOUT)
        while True:  # the rest of the answer, up to the server's close
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    assert BODY_S * 0.9 <= held < BODY_S + 3, held
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    err = json.loads(rest)["error"]
    assert err["code"] == "request_timeout" and f"{BODY_S:g} s" in err["message"]
    assert invalid_requests(server) == invalid0 + 1
    with httpx.Client(timeout=TIMEOUT) as http:
        good_request(http, server.url)
