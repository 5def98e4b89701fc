"""Request and response models of the OpenAI-compatible API (the subset specdec serves).

Requests are validated strictly (no "0.5" for a number, no true for an integer), as OpenAI
does; unknown fields are accepted and ignored so clients that send extras keep working.
Fields specdec cannot honour (best_of, suffix, ...) are refused with 400 when set to
anything but their neutral value.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


# -- errors ------------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | int | None = None,
) -> dict:
    return ErrorResponse(
        error=ErrorDetail(message=message, type=type, param=param, code=code)
    ).model_dump()


# -- requests ----------------------------------------------------------------------------------
class StreamOptions(_Strict):
    include_usage: bool | None = False


class _SamplingFields(_Strict):
    """Fields shared by both routes. ``None`` means "the default" everywhere."""

    model: str | None = None
    temperature: float | None = None  # default 1.0 (OpenAI's)
    top_p: float | None = None  # default 1.0
    top_k: int | None = None  # extension: 0 or -1 = off
    seed: int | None = None
    sampler: str | None = None  # extension: "auto" (default), "coupled", "rejection"
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # extension
    ignore_eos: bool | None = None  # extension
    presence_penalty: float | None = None  # [-2, 2], over the output so far
    frequency_penalty: float | None = None  # [-2, 2]
    repetition_penalty: float | None = None  # extension: > 0 (1 = off), prompt and output
    logit_bias: dict[str, float] | None = None  # token id (a string) -> [-100, 100]
    # {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema",
    # "strict"}}; extensions: {"type": "grammar", "grammar": "<lark>"}, {"type": "regex",
    # "pattern": "..."} (on completions too)
    response_format: dict[str, Any] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    user: str | None = None

    def unsupported(self) -> list[str]:
        """Names of set fields specdec cannot honour (each route adds its own)."""
        return []


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = None  # default 16 (OpenAI's); 0 only with echo (scoring)
    logprobs: int | None = None  # 0..5: each token's logprob and this many alternatives
    echo: bool | None = None  # the prompt before the completion (with its logprobs)
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported()
        if self.best_of not in (None, 1):
            bad.append("best_of")
        if self.suffix:
            bad.append("suffix")
        return bad


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None  # an assistant's calls (checked in tools.py)
    tool_call_id: str | None = None  # the call a tool message answers

    def as_template_input(self) -> dict:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        msg = {"role": self.role, "content": content or ""}
        if self.name:
            msg["name"] = self.name
        return msg


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # default: the rest of the context
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = None  # 0..20 alternatives per token (needs logprobs)
    tools: list[Any] | None = None  # checked in tools.py, which names the bad field
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None


# -- responses ---------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape: per token its text, logprob (None for an echoed prompt's first
    token), the most likely alternatives with the chosen token (text -> logprob), and the
    offset of its text in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculative: dict[str, Any] | None = None  # extension: the request's decoding metrics


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text of the arguments object


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None  # the token's UTF-8 bytes (a token may hold part of a character)


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """Chat's shape: one entry per generated token."""

    content: list[ChatTokenLogprob] | None
    refusal: list[ChatTokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculative: dict[str, Any] | None = None


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A streamed call: index, id, type and name (arguments "") first, then fragments of
    its arguments (index and function.arguments only)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculative: dict[str, Any] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specdec"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
