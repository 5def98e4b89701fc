"""Tools on /v1/chat/completions: the parser on fixed text (every way the text may be split
into stream pieces gives the same calls), the streamed chunks against the non-streamed answer,
the rendering of tools and earlier calls (token-identical to transformers for Qwen2.5's own
template; written into the messages for tool-blind templates), and each malformed request's
400 with the offending field, from a real server that keeps serving."""

from __future__ import annotations

import copy
import itertools
import json
import random

import httpx
import pytest
from server_utils import ServerThread

from specdec import LLM, SamplingParams
from specdec.server.app import create_app
from specdec.server.async_engine import Event
from specdec.server.generation import sse
from specdec.server.protocol import ChatMessage
from specdec.server.routes import tool_chat
from specdec.server.tool_calls import (
    HERMES,
    CallArgs,
    CallStart,
    Content,
    ToolCallParser,
    finish_reason,
    parse_output,
)
from specdec.server.tools import template_messages
from specdec.tokenizer import Tokenizer
from specdec.tool_prompt import plain_messages, tools_text

TIMEOUT = 30.0
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            # strict, as function-calling clients send it: an enforced call then ends after
            # its fields (SmolLM2 otherwise invents keys until max_tokens cuts the JSON)
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}

# a model's answer: text, then two calls (braces, quotes, a tag and unicode inside strings)
ARGS_1 = {"city": 'Pa}ris "{x}" </tool_call>', "unit": "celsius", "n": [1, {"a": [2]}]}
ARGS_2 = {"zone": "Europe/Zürich"}
TEXT = (
    "Let me look that up.\n\n<tool_call>\n"
    + json.dumps({"name": "get_weather", "arguments": ARGS_1})
    + "\n</tool_call>\n<tool_call>\n"
    + json.dumps({"name": "get_time", "arguments": ARGS_2}, ensure_ascii=False)
    + "\n</tool_call>\n"
)


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def streamed(text: str, cuts: list[int]) -> list:
    parser = ToolCallParser(new_id=ids())
    pieces = []
    for a, b in itertools.pairwise([0, *cuts, len(text)]):
        pieces += parser.feed(text[a:b])
    return pieces + parser.finish()


def assemble(pieces) -> tuple[str, list[list]]:
    content, calls = "", []
    for p in pieces:
        if isinstance(p, Content):
            content += p.text
        elif isinstance(p, CallStart):
            assert p.index == len(calls)
            calls.append([p.id, p.name, ""])
        else:
            assert isinstance(p, CallArgs) and calls, "arguments before their call"
            calls[p.index][2] += p.text
    return content, calls


# -- the parser --------------------------------------------------------------------------------
def test_parser_reads_content_and_calls():
    content, calls = parse_output(TEXT, new_id=ids())
    assert content == "Let me look that up."
    assert [(c.id, c.name) for c in calls] == [("call_0", "get_weather"), ("call_1", "get_time")]
    assert json.loads(calls[0].arguments) == ARGS_1
    assert json.loads(calls[1].arguments) == ARGS_2
    assert calls[1].arguments == json.dumps(ARGS_2, ensure_ascii=False)  # the model's own text


def test_every_split_of_the_stream_gives_the_same_answer():
    content, calls = parse_output(TEXT, new_id=ids())
    want = (content, [[c.id, c.name, c.arguments] for c in calls])
    rng = random.Random(0)
    splits = [list(range(1, len(TEXT)))]  # one character at a time
    splits += [
        sorted(rng.sample(range(1, len(TEXT)), k)) for k in (1, 3, 10, 40) for _ in range(50)
    ]
    for cuts in splits:
        pieces = streamed(TEXT, cuts)
        assert assemble(pieces) == want, cuts
        # the name comes first, before any argument, and only once
        starts = [p for p in pieces if isinstance(p, CallStart)]
        assert [s.name for s in starts] == ["get_weather", "get_time"]


def test_arguments_stream_as_they_arrive():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    parser = ToolCallParser(new_id=ids())
    head = text.index('"city"')
    assert parser.feed(text[:head]) == [CallStart(0, "call_0", "get_weather"), CallArgs(0, "{")]
    assert parser.feed('"city": "Pa') == [CallArgs(0, '"city": "Pa')]
    assert parser.feed('ris"}') == [CallArgs(0, 'ris"}')]
    assert parser.feed("}\n</tool_call>") == [] and parser.finish() == []


@pytest.mark.parametrize(
    "text,content,calls",
    [
        ("Just text, no <tool_ tags>.", "Just text, no <tool_ tags>.", []),
        ("a <tool_call> not json </tool_call> b", "a <tool_call> not json </tool_call> b", []),
        ('cut short <tool_call>\n{"name": "get_we', 'cut short <tool_call>\n{"name": "get_we', []),
        (  # another key order is read once the call is complete
            '<tool_call>{"arguments": {"zone": "UTC"}, "name": "get_time"}</tool_call>',
            "",
            [("get_time", {"zone": "UTC"})],
        ),
        ('  \n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\n', "", [("f", {})]),
        (
            'x <tool_call>{"name": "f", "arguments": {}}</tool_call> y',
            "x y",
            [("f", {})],
        ),
        ("ends in whitespace\n\n", "ends in whitespace\n\n", []),
    ],
    ids=["text", "not-json", "truncated-header", "key-order", "whitespace", "around", "trailing"],
)
def test_text_that_is_not_a_call_stays_content(text, content, calls):
    for cuts in ([], list(range(1, len(text)))):
        got_content, got_calls = assemble(streamed(text, cuts))
        assert got_content == content
        assert [(n, json.loads(a)) for _, n, a in got_calls] == calls


BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize(
    "text,names,content,calls",
    [
        (BARE, {"get_weather"}, "", [("get_weather", {"city": "Paris"})]),
        (
            f"  {BARE}\n{BARE.replace('Paris', 'Rome')}\nDone.",
            {"get_weather"},
            "Done.",
            [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})],
        ),
        (BARE, set(), BARE, []),  # no tools offered
        (BARE, {"get_time"}, BARE, []),  # a function that was not offered
        ('{"a": 1} is JSON', {"get_weather"}, '{"a": 1} is JSON', []),
        (f"Here: {BARE}", {"get_weather"}, f"Here: {BARE}", []),  # only at the start
    ],
    ids=["bare", "two-then-text", "no-names", "unknown", "other-json", "not-first"],
)
def test_an_answer_that_is_a_call_without_tags(text, names, content, calls):
    """Qwen2.5-Coder-0.5B answers with the call's JSON alone: read as a call of an offered
    function, in every split of the stream."""
    for cuts in ([], list(range(1, len(text))), [3, 9, 30]):
        parser = ToolCallParser(new_id=ids(), names=frozenset(names))
        pieces = []
        for a, b in itertools.pairwise([0, *cuts, len(text)]):
            pieces += parser.feed(text[a:b])
        got_content, got_calls = assemble(pieces + parser.finish())
        assert got_content == content
        assert [(n, json.loads(a)) for _, n, a in got_calls] == calls


def test_a_call_cut_by_max_tokens_keeps_what_was_written():
    content, calls = parse_output('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert content == "" and [c.name for c in calls] == ["get_weather"]
    assert calls[0].arguments == '{"city": "Pa'
    assert finish_reason("length", 1) == "length"
    assert finish_reason("stop", 1) == "tool_calls" and finish_reason("stop", 0) == "stop"


# -- the chat answer: streamed chunks against the whole message --------------------------------
def _events(text: str, cuts: list[int], reason: str) -> list[Event]:
    bounds = list(itertools.pairwise([0, *cuts, len(text)]))
    evs = [Event(index=0, text=text[a:b]) for a, b in bounds[:-1]]
    a, b = bounds[-1]
    return [*evs, Event(index=0, text=text[a:b], finish_reason=reason)]


def test_streamed_tool_call_chunks_reassemble_to_the_message():
    whole = tool_chat(1, HERMES).choice(0, TEXT, "stop", None).model_dump()
    msg = whole["message"]
    assert whole["finish_reason"] == "tool_calls" and msg["content"] == "Let me look that up."
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather", "get_time"]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in msg["tool_calls"])

    shape = tool_chat(1, HERMES)
    chunks = []
    for ev in _events(TEXT, [5, 30, 31, 60, 90, 140, 141, 200], "stop"):
        for choice in shape.deltas(ev, None):
            body = shape.chunk(id="x", created=0, model="m", choices=[choice])
            chunks.append(json.loads(sse(body).removeprefix("data: ")))
    content, calls, reasons = "", {}, []
    for ch in chunks:
        (c,) = ch["choices"]
        delta = c["delta"]
        content += delta.get("content", "")
        reasons.append(c["finish_reason"])
        for tc in delta.get("tool_calls", []):
            if tc["index"] not in calls:  # a call's first chunk: id, type, name, no arguments
                assert set(tc) == {"index", "id", "type", "function"}, tc
                assert tc["function"]["arguments"] == "" and tc["type"] == "function"
                calls[tc["index"]] = {"id": tc["id"], "name": tc["function"]["name"], "args": ""}
            else:  # then fragments of the arguments only
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[tc["index"]]["args"] += tc["function"]["arguments"]
    assert content == msg["content"]
    assert [(c["name"], c["args"]) for c in calls.values()] == [
        (t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]
    ]
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}


def test_an_answer_without_calls_is_plain_content():
    shape = tool_chat(1, HERMES)
    whole = shape.choice(0, "Hello there.", "stop", None).model_dump()
    assert whole["message"] == {"role": "assistant", "content": "Hello there.", "tool_calls": None}
    assert whole["finish_reason"] == "stop"


# -- rendering ---------------------------------------------------------------------------------
def openai_conversation() -> list[dict]:
    """A two-turn conversation in OpenAI's shapes: a call (content null), then its result."""
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": '{"zone": "Europe/Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "18 C, sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "14:05"},
    ]


def test_tool_blind_templates_get_tools_and_calls_in_the_messages():
    msgs = template_messages([ChatMessage(**m) for m in openai_conversation()])
    plain = plain_messages(msgs, [WEATHER, TIME])
    call_a = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    call_b = (
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "Europe/Paris"}}\n</tool_call>'
    )
    assert plain == [
        {"role": "system", "content": "You are terse.\n\n" + tools_text([WEATHER, TIME])},
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": f"{call_a}\n{call_b}"},
        {
            "role": "user",
            "content": "<tool_response>\n18 C, sunny\n</tool_response>\n"
            "<tool_response>\n14:05\n</tool_response>",
        },
    ]
    assert json.dumps(WEATHER) in tools_text([WEATHER])


@pytest.mark.real
def test_smollm2_prompt_carries_the_tools(smollm2_path):
    """SmolLM2's template renders role and content only: the tools reach the model through
    the system message, in the format the parser reads."""
    tok = Tokenizer(smollm2_path)
    msgs = template_messages([ChatMessage(**m) for m in openai_conversation()])
    text = tok.hf.decode(tok.apply_chat_template(msgs, [WEATHER]))
    assert text == (
        "<|im_start|>system\nYou are terse.\n\n" + tools_text([WEATHER]) + "<|im_end|>\n"
        "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": '
        '"Europe/Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18 C, sunny\n</tool_response>\n<tool_response>\n"
        "14:05\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.heavy
def test_qwen_rendering_is_token_identical_to_transformers():
    """Qwen2.5's own template renders the tools: our OpenAI-shaped request gives exactly the
    ids transformers gives for the same conversation in its documented form."""
    import transformers

    from specdec.registry import resolve_model

    folder = resolve_model("qwen2.5-coder-0.5b")
    ours = Tokenizer(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    convo = openai_conversation()
    canonical = copy.deepcopy(convo)
    for m in canonical:  # transformers' form: arguments as objects
        for c in m.get("tool_calls") or []:
            c["function"] = {**c["function"], "arguments": json.loads(c["function"]["arguments"])}
    for upto in (2, 3, 5):  # the first turn, the call, the results
        msgs = template_messages([ChatMessage(**m) for m in convo[:upto]])
        want = hf.apply_chat_template(
            canonical[:upto], tools=[WEATHER, TIME], add_generation_prompt=True, tokenize=True
        )
        if isinstance(want, dict) or hasattr(want, "input_ids"):
            want = want["input_ids"]
        assert ours.apply_chat_template(msgs, [WEATHER, TIME]) == list(want)


# -- the server: bad tools and calls get a 400 naming the field --------------------------------
@pytest.fixture(scope="module")
def server(tiny_dirs):
    llm = LLM(tiny_dirs["llama"], dtype="float32")
    with ServerThread(create_app(llm, "tiny", max_num_seqs=4)) as srv:
        yield srv


def post(srv, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=TIMEOUT)


USER = [{"role": "user", "content": "w3 w4"}]


def with_fn(**fn) -> dict:
    return {"type": "function", "function": fn}


BAD_TOOLS = [
    # (request fields, the param the 400 names)
    ({"tools": [with_fn(description="no name")]}, "tools[0].function.name"),
    ({"tools": [with_fn(name="has space")]}, "tools[0].function.name"),
    ({"tools": [WEATHER, {"type": "retrieval"}]}, "tools[1].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [with_fn(name="f", parameters={"type": "string"})]}, "tools[0].function.parameters"),
    ({"tools": [with_fn(name="f", parameters=[1])]}, "tools[0].function.parameters"),
    (
        {"tools": [with_fn(name="f", parameters={"type": "object", "properties": 3})]},
        "tools[0].function.parameters",
    ),
    ({"tools": [with_fn(name="f", description=5)]}, "tools[0].function.description"),
    ({"tools": [WEATHER, TIME, WEATHER]}, "tools[2].function.name"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
]


def _call(cid="call_1", args='{"city": "w3"}', **kw) -> dict:
    return {
        "id": cid,
        "type": "function",
        "function": {"name": "get_weather", "arguments": args},
        **kw,
    }


BAD_MESSAGES = [
    (
        [*USER, {"role": "tool", "tool_call_id": "call_9", "content": "w5"}],
        "messages[1].tool_call_id",
    ),
    ([*USER, {"role": "tool", "content": "w5"}], "messages[1].tool_call_id"),
    (
        [  # a result before its call
            *USER,
            {"role": "tool", "tool_call_id": "call_1", "content": "w5"},
            {"role": "assistant", "content": None, "tool_calls": [_call()]},
        ],
        "messages[1].tool_call_id",
    ),
    ([{"role": "user", "content": "w3", "tool_calls": [_call()]}], "messages[0].tool_calls"),
    (
        [*USER, {"role": "assistant", "tool_calls": [_call(args="{city: w3}")]}],
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        [*USER, {"role": "assistant", "tool_calls": [_call(args="[1]")]}],
        "messages[1].tool_calls[0].function.arguments",
    ),
    ([*USER, {"role": "assistant", "tool_calls": [_call(cid="")]}], "messages[1].tool_calls[0].id"),
    ([*USER, {"role": "assistant", "tool_calls": ["x"]}], "messages[1].tool_calls[0]"),
]


def assert_serving(srv):
    r = post(srv, {"messages": USER, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize(
    "fields,param", BAD_TOOLS + [({"messages": m}, p) for m, p in BAD_MESSAGES]
)
def test_malformed_tools_and_calls_get_400_naming_the_field(server, fields, param):
    r = post(server, {"messages": USER, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert err["message"]
    assert_serving(server)


def greedy_text(llm, ids, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return llm.generate([ids], params)[0].text


def test_tools_reach_the_prompt_and_none_withholds_them(server, tiny_llm):
    """With tools (auto) the prompt is the conversation with the tools rendered; with
    tool_choice "none" it is the plain conversation: the answers are the Python API's."""
    convo = [*USER, {"role": "assistant", "content": None, "tool_calls": [_call()]}]
    convo.append({"role": "tool", "tool_call_id": "call_1", "content": "w5 w6"})
    msgs = template_messages([ChatMessage(**m) for m in convo])
    for choice, tools in (("auto", [WEATHER]), ("none", None)):
        r = post(
            server,
            {
                "messages": convo,
                "tools": [WEATHER],
                "tool_choice": choice,
                "max_tokens": 6,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        ids = tiny_llm.chat_prompt(msgs, tools)
        assert body["usage"]["prompt_tokens"] == len(ids)
        msg = body["choices"][0]["message"]
        assert msg["content"] == greedy_text(tiny_llm, ids, 6) and msg["tool_calls"] is None
    with_tools = tiny_llm.chat_prompt(msgs, [WEATHER])
    assert with_tools != tiny_llm.chat_prompt(msgs, None)


# -- enforced calls: a tiny random model that speaks in tool-call pieces -----------------------
SPACE, NEWLINE = "\u0120", "\u010a"  # byte-level BPE's spellings of " " and "\n"
TOOL_PIECES = ["<unk>", "<s>", "</s>", "<tool_call>", "</tool_call>"]
TOOL_PIECES += [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789")
TOOL_PIECES += list('{}[]":,_-.<>/') + [SPACE, NEWLINE]
TOOL_PIECES += [
    '{"name":' + SPACE + '"',
    '",' + SPACE + '"arguments":' + SPACE,
    "get_weather",
    "get_time",
    "city",
    "zone",
    "days",
    "utc",
]  # 64 tokens


def write_tool_tokenizer(folder) -> None:
    """A byte-level tokenizer (no merges) of 64 pieces: letters, digits, JSON punctuation,
    a few whole words, and Qwen's tags as single added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(TOOL_PIECES)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(w, special=True) for w in TOOL_PIECES[:3]])
    tok.add_tokens([AddedToken(w, special=False) for w in TOOL_PIECES[3:5]])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def tool_dirs(tmp_path_factory):
    from tiny_models import build

    root = tmp_path_factory.mktemp("tool_models")
    dirs = {
        "target": build(root / "target", "llama", seed=31, vocab_size=64, max_pos=2048),
        "draft": build(
            root / "draft", "llama", seed=32, vocab_size=64, hidden=32, layers=1, max_pos=2048
        ),
    }
    for d in dirs.values():
        write_tool_tokenizer(d)
    return dirs


FORECAST = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "unit": {"enum": ["celsius", "kelvin"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "paris"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
NO_ARGS = {"type": "function", "function": {"name": "now"}}
TOOLS = [FORECAST, CLOCK, NO_ARGS]


def assert_valid_calls(message: dict, allowed: set[str]) -> None:
    """The message is one or more calls of ``allowed`` functions, arguments valid under
    each function's schema (an absent schema: no arguments at all)."""
    from jsonschema import validate

    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in TOOLS}
    assert message["content"] is None and message["tool_calls"], message
    for call in message["tool_calls"]:
        name = call["function"]["name"]
        assert name in allowed and call["type"] == "function" and call["id"].startswith("call_")
        args = json.loads(call["function"]["arguments"])
        validate(args, schemas[name] or {"type": "object", "maxProperties": 0})


@pytest.fixture(scope="module")
def tool_server(tool_dirs):
    llm = LLM(tool_dirs["target"], dtype="float32")
    with ServerThread(create_app(llm, "tiny-tools", max_num_seqs=8)) as srv:
        yield srv


def openai_client(srv):
    import openai

    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=60)


ASK = [{"role": "user", "content": "weather in paris"}]


@pytest.mark.parametrize(
    "choice,allowed",
    [
        ("required", {"get_weather", "get_time", "now"}),
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
    ],
    ids=["required", "named", "named-schema"],
)
def test_required_and_named_choices_always_give_a_valid_call(tool_server, choice, allowed):
    """Whatever a random model would have said, sampled answers are one call of an allowed
    function with valid arguments, and the finish reason says so."""
    r = openai_client(tool_server).chat.completions.create(
        model="tiny-tools",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,
        n=8,
        seed=5,
        temperature=1.0,
        max_tokens=300,
    )
    for c in r.choices:
        assert c.finish_reason == "tool_calls", c
        assert_valid_calls(c.message.model_dump(), allowed)
        assert len(c.message.tool_calls) == 1


def test_parallel_calls_are_each_valid(tool_server):
    """With parallel calls (the default) an answer may hold several calls, each valid; an
    answer cut by max_tokens keeps its complete calls."""
    r = post(
        tool_server,
        {
            "messages": ASK,
            "tools": TOOLS,
            "tool_choice": "required",
            "n": 8,
            "seed": 9,
            "max_tokens": 120,
        },
    )
    assert r.status_code == 200, r.text
    counts = []
    for c in r.json()["choices"]:
        msg = c["message"]
        if c["finish_reason"] == "length":  # the last call (or its tag) may be cut short
            if msg["tool_calls"] and msg["content"] is None:
                msg = {**msg, "tool_calls": msg["tool_calls"][:-1] or None}
            msg["content"] = None
            if not msg["tool_calls"]:
                continue
        else:
            assert c["finish_reason"] == "tool_calls"
        assert_valid_calls(msg, {"get_weather", "get_time", "now"})
        counts.append(len(msg["tool_calls"]))
    assert max(counts) >= 2, counts


def test_streamed_calls_reassemble_to_the_non_streamed_answer(tool_server):
    """The same seeded request, streamed and not: the same calls (ids aside), built from an
    id/name chunk and argument fragments."""
    c = openai_client(tool_server)
    kw = dict(model="tiny-tools", messages=ASK, tools=TOOLS, tool_choice="required", seed=11)
    whole = c.chat.completions.create(**kw, max_tokens=300).choices[0]
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in c.chat.completions.create(**kw, max_tokens=300, stream=True):
        for ch in chunk.choices:
            reasons.append(ch.finish_reason)
            for tc in ch.delta.tool_calls or []:
                if tc.id is not None:
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                calls[tc.index]["arguments"] += tc.function.arguments or ""
    want = [
        {"name": t.function.name, "arguments": t.function.arguments}
        for t in whole.message.tool_calls
    ]
    assert [calls[i] for i in sorted(calls)] == want
    assert reasons[-1] == "tool_calls" == whole.finish_reason


def test_two_turn_tool_call_with_the_openai_client(tool_server, tool_dirs):
    """The model calls a function; the client runs it and sends the result back with the
    call in the history; the model answers in text. The second prompt is the conversation
    rendered with the call and its result."""
    c = openai_client(tool_server)
    first = c.chat.completions.create(
        model="tiny-tools",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=100,
    )
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = msg.tool_calls
    assert call.function.name == "get_time"
    zone = json.loads(call.function.arguments)["zone"]
    history = [
        *ASK,
        msg,  # the assistant's message object, sent back as it came (null fields and all)
        {"role": "tool", "tool_call_id": call.id, "content": f"{zone} 12:00"},
    ]
    second = c.chat.completions.create(
        model="tiny-tools", messages=history, tools=TOOLS, temperature=0, max_tokens=8
    )
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.tool_calls is None
    llm = LLM(tool_dirs["target"], dtype="float32")
    history[1] = msg.model_dump(exclude_none=True)
    msgs = template_messages([ChatMessage(**m) for m in history])
    ids = llm.chat_prompt(msgs, TOOLS)
    assert second.usage.prompt_tokens == len(ids)
    assert answer.message.content == greedy_text(llm, ids, 8)
    text = llm.tokenizer.hf.decode(ids)
    assert f"<tool_response>\n{zone} 12:00\n</tool_response>" in text
    assert call.function.arguments in text  # the call, rendered back as the model wrote it


@pytest.mark.parametrize(
    "kw",
    [{"method": "sd", "num_speculative_tokens": 3}, {"method": "ngram"}],
    ids=["sd", "ngram"],
)
def test_enforced_calls_are_token_identical_to_ar(tool_dirs, kw):
    """Under the call grammar every method is lossless: greedy speculative decoding gives
    AR's tokens exactly."""
    from specdec.server.tool_calls import HERMES as FMT
    from specdec.server.tool_grammar import call_constraint
    from specdec.server.tools import tool_request

    ar = LLM(tool_dirs["target"], dtype="float32")
    tools = tool_request(TOOLS, "required", False)  # one call, then EOS
    constraint = call_constraint(tools, ar.tokenizer, FMT)
    params = SamplingParams(temperature=0, max_tokens=120, constraint=constraint)
    prompts = [ar.chat_prompt([{"role": "user", "content": t}], TOOLS) for t in ("a", "time")]
    want = [o.token_ids for o in ar.generate(prompts, params)]
    for tokens in want:
        content, calls = parse_output(ar.tokenizer.decode(tokens))
        assert content == "" and calls, ar.tokenizer.decode(tokens)
    if kw["method"] == "sd":
        kw = {**kw, "draft_model": tool_dirs["draft"]}
    llm = LLM(tool_dirs["target"], dtype="float32", **kw)
    assert [o.token_ids for o in llm.generate(prompts, params)] == want


def test_parameters_the_grammar_engine_cannot_enforce_are_a_400(tool_server):
    odd = with_fn(
        name="odd",
        parameters={"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}},
    )
    r = post(
        tool_server,
        {"messages": ASK, "tools": [CLOCK, odd], "tool_choice": "required", "max_tokens": 4},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[1].function.parameters"
    r = post(
        tool_server,
        {
            "messages": ASK,
            "tools": [CLOCK],
            "tool_choice": "required",
            "response_format": {"type": "json_object"},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


# -- real models -------------------------------------------------------------------------------
def two_turns(srv, model: str, first_choice, second_choice="auto", max_tokens: int = 24):
    """Turn 1: the question, with tools; turn 2: the call and its result sent back. Returns
    both responses and the history of turn 2."""
    c = openai_client(srv)
    ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    first = c.chat.completions.create(
        model=model,
        messages=ask,
        tools=[WEATHER],
        tool_choice=first_choice,
        temperature=0,
        max_tokens=40,
    )
    msg = first.choices[0].message
    (call,) = msg.tool_calls
    history = [
        *ask,
        msg.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": '{"temperature_c": 18, "sky": "sunny"}',
        },
    ]
    second = c.chat.completions.create(
        model=model,
        messages=history,
        tools=[WEATHER],
        tool_choice=second_choice,
        temperature=0,
        max_tokens=max_tokens,
    )
    return first, second, history


def check_weather_call(first) -> None:
    from jsonschema import validate

    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


@pytest.mark.real
def test_smollm2_two_turn_tool_call(smollm2_path):
    """SmolLM2-135M does not call tools by itself: a named tool_choice makes its answer a
    valid call; with the result sent back it answers in text, from the whole conversation."""
    llm = LLM(smollm2_path)
    with ServerThread(create_app(llm, "smollm2", max_num_seqs=2)) as srv:
        named = {"type": "function", "function": {"name": "get_weather"}}
        first, second, history = two_turns(srv, "smollm2", named)
        check_weather_call(first)
        # the same request streamed: the same call, in an id/name chunk and fragments
        stream = openai_client(srv).chat.completions.create(
            model="smollm2",
            messages=history[:1],
            tools=[WEATHER],
            tool_choice=named,
            temperature=0,
            max_tokens=40,
            stream=True,
        )
        args = "".join(
            tc.function.arguments or ""
            for ch in stream
            for c in ch.choices
            for tc in c.delta.tool_calls or []
        )
        assert args == first.choices[0].message.tool_calls[0].function.arguments
    msgs = template_messages([ChatMessage(**m) for m in history])
    ids = llm.chat_prompt(msgs, [WEATHER])
    assert second.usage.prompt_tokens == len(ids)
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length", "tool_calls")
    assert answer.message.content or answer.message.tool_calls


@pytest.mark.heavy
def test_qwen_calls_a_tool_by_itself_and_answers_from_its_result():
    """Qwen2.5-Coder-0.5B, tool_choice auto: it calls get_weather on its own (its answer is
    the call's JSON), and answers from the result once the client sends it back (with
    tool_choice "none": this small model would otherwise call again)."""
    llm = LLM("qwen2.5-coder-0.5b")
    with ServerThread(create_app(llm, "qwen", max_num_seqs=2)) as srv:
        first, second, _ = two_turns(srv, "qwen", "auto", "none", max_tokens=32)
        # enforced, the call is written with Qwen's tag tokens (special tokens in the grammar)
        forced = openai_client(srv).chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": "Weather in Rome?"}],
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,  # greedy, this model would call again and again
            temperature=0,
            max_tokens=40,
        )
    check_weather_call(first)
    check_weather_call(forced)
    answer = second.choices[0].message
    assert answer.tool_calls is None and "18" in answer.content, answer
