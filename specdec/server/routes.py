"""The routes: health, Prometheus metrics, models, completions and chat completions.

The two generation routes only turn their request into sequences; ``respond`` submits them
and answers with one JSON body, or with server-sent events when the request streams. What
differs between the two answers (the body's type, a choice, a chunk) is a ``Shape``.
Each route reads the engine, metrics and model from ``request.app.state`` (see ``app``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from specdec.sequence import Sequence
from specdec.server.async_engine import Event
from specdec.server.errors import APIError
from specdec.server.generation import Generation, sse
from specdec.server.inputs import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    chat_logprobs,
    chat_prompt_ids,
    check_capacity,
    check_model,
    completion_logprobs,
    completion_prompts,
    make_sequence,
    num_choices,
    rest_of_context,
    sampling_params,
)
from specdec.server.logprobs import ChatReport, CompletionReport
from specdec.server.metrics import CONTENT_TYPE, speculative_info
from specdec.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    FunctionCall,
    FunctionCallDelta,
    ModelCard,
    ModelList,
    ToolCall,
    ToolCallDelta,
)
from specdec.server.tool_calls import (
    CallStart,
    Content,
    Piece,
    ToolCallFormat,
    ToolCallParser,
    finish_reason,
    format_for_template,
    parse_output,
)
from specdec.server.tool_grammar import call_constraint
from specdec.server.tools import template_messages, tool_request

router = APIRouter()


# -- the answer to a generation request --------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """What differs between the completion and the chat answers."""

    response: Callable[..., BaseModel]  # the non-streamed body
    # its choice (index, text, finish reason, logprobs or None)
    choice: Callable[[int, str, str | None, Any], BaseModel]
    chunk: Callable[..., BaseModel]  # a streamed event's body
    deltas: Callable[[Event, Any], list[BaseModel]]  # one event's choices (with its logprobs)
    opening: Callable[[int], list[BaseModel]]  # choices sent before the first token (n)


def _completion_deltas(ev: Event, logprobs) -> list[BaseModel]:
    """One chunk: the new text and its tokens' logprobs, with the finish reason on the
    choice's last."""
    if not ev.text and not ev.logprobs and ev.finish_reason is None:
        return []
    choice = CompletionChoice(
        index=ev.index, text=ev.text, logprobs=logprobs, finish_reason=ev.finish_reason
    )
    return [choice]


def _chat_deltas(ev: Event, logprobs) -> list[BaseModel]:
    """The new text (and its tokens' logprobs), then the finish reason in a chunk of its own
    (an empty delta)."""
    out: list[BaseModel] = []
    if ev.text or ev.logprobs:
        delta = Delta(content=ev.text)
        out.append(ChatChunkChoice(index=ev.index, delta=delta, logprobs=logprobs))
    if ev.finish_reason is not None:
        out.append(ChatChunkChoice(index=ev.index, delta=Delta(), finish_reason=ev.finish_reason))
    return out


COMPLETION = Shape(
    response=Completion,
    choice=lambda i, text, reason, lp: CompletionChoice(
        index=i, text=text, logprobs=lp, finish_reason=reason
    ),
    chunk=Completion,
    deltas=_completion_deltas,
    opening=lambda n: [],
)
CHAT = Shape(
    response=ChatCompletion,
    choice=lambda i, text, reason, lp: ChatChoice(
        index=i, message=AssistantMessage(content=text), logprobs=lp, finish_reason=reason
    ),
    chunk=ChatCompletionChunk,
    deltas=_chat_deltas,
    opening=lambda n: [
        ChatChunkChoice(index=j, delta=Delta(role="assistant", content="")) for j in range(n)
    ],
)


def _piece_delta(piece: Piece) -> Delta:
    if isinstance(piece, Content):
        return Delta(content=piece.text)
    if isinstance(piece, CallStart):
        fn = FunctionCallDelta(name=piece.name, arguments="")
        return Delta(
            tool_calls=[ToolCallDelta(index=piece.index, id=piece.id, type="function", function=fn)]
        )
    fn = FunctionCallDelta(arguments=piece.text)
    return Delta(tool_calls=[ToolCallDelta(index=piece.index, function=fn)])


def tool_chat(n: int, fmt: ToolCallFormat, names: frozenset[str] = frozenset()) -> Shape:
    """The chat answer of a request that offered tools: each choice's text read by its own
    parser, calls in ``tool_calls`` (streamed as ``delta.tool_calls``), and the finish
    reason "tool_calls" when the model stopped after calling."""
    parsers = [ToolCallParser(fmt, names=names) for _ in range(n)]

    def deltas(ev: Event, logprobs) -> list[BaseModel]:
        parser = parsers[ev.index]
        pieces = parser.feed(ev.text) if ev.text else []
        if ev.finish_reason is not None:
            pieces += parser.finish()
        out: list[BaseModel] = [
            ChatChunkChoice(index=ev.index, delta=_piece_delta(p)) for p in pieces
        ]
        if logprobs is not None:  # the event's tokens' logprobs ride on its first chunk
            if not out:
                out.append(ChatChunkChoice(index=ev.index, delta=Delta()))
            out[0].logprobs = logprobs
        if ev.finish_reason is not None:
            reason = finish_reason(ev.finish_reason, parser.calls)
            out.append(ChatChunkChoice(index=ev.index, delta=Delta(), finish_reason=reason))
        return out

    def choice(i: int, text: str, reason: str | None, logprobs) -> BaseModel:
        content, calls = parse_output(text, fmt, names=names)
        tool_calls = [
            ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in calls
        ]
        message = AssistantMessage(
            content=content if content or not calls else None, tool_calls=tool_calls or None
        )
        reason = finish_reason(reason, len(calls))
        return ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=reason)

    return Shape(
        response=ChatCompletion,
        choice=choice,
        chunk=ChatCompletionChunk,
        deltas=deltas,
        opening=CHAT.opening,
    )


async def respond(
    request: Request,
    req: CompletionRequest | ChatCompletionRequest,
    rid: str,
    seqs: list[Sequence],
    prompt_tokens: int,
    shape: Shape,
    report: CompletionReport | ChatReport,
) -> BaseModel | StreamingResponse:
    """Submit ``seqs`` and answer: the whole body once every choice finished, or, when
    ``req.stream``, one event per piece of text, with the ``speculative`` object (and, with
    ``stream_options.include_usage``, the usage) at the end, then ``[DONE]``. ``report``
    gives each choice's echoed prompt and logprobs in the route's shape."""
    gen = Generation.submit(request, seqs, prompt_tokens)
    state = request.app.state
    method = state.llm.method
    now = int(time.time())

    def body(make, choices, **kw) -> BaseModel:
        return make(id=rid, created=now, model=state.model_name, choices=choices, **kw)

    if not req.stream:
        texts, reasons, ms = await gen.collect()
        choices = [
            shape.choice(i, report.echo_text(i) + t, r, report.whole(i))
            for i, (t, r) in enumerate(zip(texts, reasons))
        ]
        info = speculative_info(ms, method)
        return body(shape.response, choices, usage=gen.usage(), speculative=info)

    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def events():
        for choice in shape.opening(len(seqs)):
            yield sse(body(shape.chunk, [choice]))
        ms: list[dict | None] = [None] * len(seqs)
        started: set[int] = set()
        while not gen.done:
            ev = await gen.next_event()
            if ev.index not in started:  # the echoed prompt goes first (its logprobs are in)
                started.add(ev.index)
                echo = Event(ev.index, report.echo_text(ev.index))
                for choice in shape.deltas(echo, report.prompt(ev.index)):
                    yield sse(body(shape.chunk, [choice]))
            if ev.finish_reason is not None:
                ms[ev.index] = ev.metrics
            # the request's last finish carries its metrics, unless a usage chunk follows
            last = ev.finish_reason is not None and gen.done and not include_usage
            deltas = shape.deltas(ev, report.generated(ev.index, ev.logprobs))
            for k, choice in enumerate(deltas):
                info = speculative_info(ms, method) if last and k == len(deltas) - 1 else None
                yield sse(body(shape.chunk, [choice], speculative=info))
        gen.metrics.count("success")
        if include_usage:
            info = speculative_info(ms, method)
            yield sse(body(shape.chunk, [], usage=gen.usage(), speculative=info))
        yield "data: [DONE]\n\n"

    return gen.stream(events())


# -- routes ------------------------------------------------------------------------------------
@router.get("/health")
async def health(request: Request):
    engine = request.app.state.engine
    if engine.alive:
        return {"status": "ok"}
    reason = repr(engine.error) if engine.error else "the engine thread is not running"
    return JSONResponse({"status": "error", "error": reason}, status_code=503)


@router.get("/metrics")
async def prometheus_metrics(request: Request):
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


def _model_card(request: Request) -> ModelCard:
    state = request.app.state
    return ModelCard(
        id=state.model_name, created=state.created, max_model_len=state.engine.max_model_len
    )


@router.get("/v1/models")
async def list_models(request: Request):
    return ModelList(data=[_model_card(request)])


@router.get("/v1/models/{name:path}")
async def get_model(name: str, request: Request):
    check_model(name, request.app.state.model_name)
    return _model_card(request)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request):
    state = request.app.state
    n = num_choices(req, state.model_name)
    prompts = completion_prompts(req.prompt)
    max_tokens = DEFAULT_COMPLETION_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    logprobs, prompt_logprobs = completion_logprobs(req, max_tokens)
    check_capacity(len(prompts), n, state.engine.max_num_seqs, state.engine.max_waiting)
    rid = f"cmpl-{uuid.uuid4().hex}"

    def build() -> list[Sequence]:
        seqs = []
        for i, prompt in enumerate(prompts):
            label = "prompt " if len(prompts) == 1 else f"prompt {i} "
            for j in range(n):
                seed = None if req.seed is None else req.seed + j
                params = sampling_params(req, max_tokens, seed, logprobs, prompt_logprobs)
                rid_j = f"{rid}-{len(seqs)}"
                seqs.append(make_sequence(state.llm, prompt, params, rid_j, label, "prompt"))
        return seqs

    seqs = await asyncio.to_thread(build)
    prompt_tokens = sum(len(seqs[i * n].prompt_ids) for i in range(len(prompts)))
    echo = None
    if req.echo:  # a prompt given as tokens is echoed as their text
        given = [p for p in prompts for _ in range(n)]
        decode = state.llm.tokenizer.decode
        echo = [p if isinstance(p, str) else decode(s.prompt_ids) for p, s in zip(given, seqs)]
    report = CompletionReport(state.llm.tokenizer, seqs, echo)
    return await respond(request, req, rid, seqs, prompt_tokens, COMPLETION, report)


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request):
    state = request.app.state
    n = num_choices(req, state.model_name)
    check_capacity(1, n, state.engine.max_num_seqs, state.engine.max_waiting)
    tools = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
    messages = template_messages(req.messages)
    fmt = format_for_template(state.llm.tokenizer.chat_template(tools=True))
    constraint = None
    if tools.enforced:
        _no_other_format(req)
        constraint = await asyncio.to_thread(call_constraint, tools, state.llm.tokenizer, fmt)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    limit = req.max_completion_tokens
    if limit is None:
        limit = req.max_tokens
    logprobs = chat_logprobs(req, limit)

    def build() -> list[Sequence]:
        ids = chat_prompt_ids(state.llm, messages, tools.offered)
        max_tokens = limit
        if max_tokens is None:  # default: the rest of the context
            max_tokens = rest_of_context(len(ids), state.engine.max_model_len)
        seqs = []
        for j in range(n):
            seed = None if req.seed is None else req.seed + j
            params = sampling_params(req, max_tokens, seed, logprobs)
            if constraint is not None:  # the answer must be a call
                params = dataclasses.replace(params, constraint=constraint)
            seqs.append(make_sequence(state.llm, ids, params, f"{rid}-{j}", "prompt ", "messages"))
        return seqs

    seqs = await asyncio.to_thread(build)
    report = ChatReport(state.llm.tokenizer, seqs)
    names = frozenset(fn["name"] for fn in tools.functions())
    shape = tool_chat(n, fmt, names) if tools.offered else CHAT
    return await respond(request, req, rid, seqs, len(seqs[0].prompt_ids), shape, report)


def _no_other_format(req: ChatCompletionRequest) -> None:
    """A required call is a grammar of its own: no response_format beside it."""
    if req.response_format and req.response_format.get("type") not in (None, "text"):
        raise APIError(
            400,
            'response_format cannot be combined with tool_choice "required" or a named '
            "function (the answer is a tool call)",
            param="response_format",
            code="invalid_value",
        )
