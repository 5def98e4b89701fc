"""From an OpenAI request to the engine's sequences, with the API's answer for each bad input
(an ``APIError`` that names the offending parameter)."""

from __future__ import annotations

from specdec.constraints import check_constraint
from specdec.sampling import MAX_LOGPROBS, SamplingParams
from specdec.sequence import Sequence
from specdec.server.errors import APIError
from specdec.tokenizer import InvalidText

MAX_N = 128
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for the legacy ``logprobs``
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "sampler",
    "stop_token_ids",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
)


def check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(
            404,
            f"The model '{name}' does not exist (this server serves '{served}')",
            param="model",
            code="model_not_found",
        )


def num_choices(req, served: str) -> int:
    """``n`` of a request whose model and parameters specdec can serve."""
    check_model(req.model, served)
    bad = req.unsupported()
    if bad:
        raise APIError(
            400,
            f"unsupported parameter: {bad[0]} (specdec does not implement it)",
            param=bad[0],
            code="unsupported_parameter",
        )
    n = 1 if req.n is None else req.n
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be in [1, {MAX_N}], got {n}", param="n", code="invalid_value")
    return n


def check_capacity(prompts: int, n: int, running: int, waiting: int) -> None:
    """Refuse a request that could never be admitted: its ``prompts`` x ``n`` sequences enter
    the engine all at once, so together they must fit its ``running`` + ``waiting`` places.
    Too many prompts are the prompt's fault; too many choices per prompt, ``n``'s."""
    capacity = running + waiting
    if prompts * n <= capacity:
        return
    limit = (
        f"the server's capacity of {capacity} sequences ({running} decoded together + "
        f"{waiting} waiting), which a request's sequences must fit all at once"
    )
    if prompts > capacity:
        msg = f"{prompts} prompts exceed {limit}: send at most {capacity} prompts per request"
        raise APIError(400, msg, param="prompt", code="invalid_value")
    asked = (
        f"{prompts} prompts x n={n} = {prompts * n} choices" if prompts > 1 else f"n={n} choices"
    )
    msg = f"{asked} exceed {limit}: ask for at most n={capacity // prompts}"
    raise APIError(400, msg, param="n", code="invalid_value")


def completion_prompts(prompt) -> list:
    """A completion request's prompts: one text or token list, or a list of them."""
    # an empty token list is one prompt, so that make_sequence says "empty"
    single = isinstance(prompt, str) or not prompt or isinstance(prompt[0], int)
    return [prompt] if single else list(prompt)


def chat_prompt_ids(llm, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The messages under the model's chat template, ``tools`` offered to the model."""
    try:
        return llm.chat_prompt(messages, tools)
    except InvalidText as exc:
        raise APIError(400, str(exc), param="messages", code="invalid_value") from exc
    except Exception as exc:  # noqa: BLE001 - template errors are the input's fault
        msg = f"could not apply the chat template: {exc}"
        raise APIError(400, msg, param="messages", code="invalid_value") from exc


def rest_of_context(prompt_len: int, max_model_len: int) -> int:
    """Chat's default ``max_tokens``: what the context has left after the messages."""
    if max_model_len - prompt_len < 1:
        raise APIError(
            400,
            f"the messages take {prompt_len} tokens, the whole context of {max_model_len} tokens",
            param="messages",
            code="context_length_exceeded",
        )
    return max_model_len - prompt_len


def constraint_of(response_format: dict | None) -> dict | None:
    """The constraint (constraints.py) an OpenAI ``response_format`` asks for; None for text.
    A malformed format, a schema the grammar engine rejects or a keyword it cannot enforce:
    400 naming ``response_format``."""
    if response_format is None:
        return None

    def bad(msg: str):
        raise APIError(400, msg, param="response_format", code="invalid_value")

    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_schema":
        body = response_format.get("json_schema")
        if not isinstance(body, dict) or "schema" not in body:
            bad("response_format json_schema needs a 'json_schema' object with a 'schema'")
        spec = {"type": "json_schema", "schema": body["schema"]}
    elif kind in ("json_object", "grammar", "regex"):
        spec = dict(response_format)
    else:
        bad(
            "response_format type must be text, json_object or json_schema (or the extensions "
            f"grammar, regex), got {kind!r}"
        )
    try:
        return check_constraint(spec)
    except ValueError as exc:
        bad(str(exc).replace("invalid constraint", "invalid response_format", 1))


def completion_logprobs(req, max_tokens: int) -> tuple[int | None, int | None]:
    """A completion request's (logprobs, prompt_logprobs): ``logprobs`` alternatives for the
    generated tokens, and with ``echo`` for the prompt's too. ``max_tokens`` 0 is scoring,
    which only makes sense with ``echo``."""
    n = req.logprobs
    if n is not None and not 0 <= n <= MAX_COMPLETION_LOGPROBS:
        raise APIError(
            400,
            f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {n}",
            param="logprobs",
            code="invalid_value",
        )
    if max_tokens == 0 and not req.echo:
        raise APIError(
            400,
            "max_tokens must be >= 1 (0 only with echo, which returns the prompt's logprobs)",
            param="max_tokens",
            code="invalid_value",
        )
    return n, (n if req.echo else None)


def chat_logprobs(req, max_tokens: int | None) -> int | None:
    """A chat request's ``logprobs`` setting: None when off, else its ``top_logprobs``."""
    if max_tokens is not None and max_tokens < 1:
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        raise APIError(
            400, f"{param} must be >= 1, got {max_tokens}", param=param, code="invalid_value"
        )
    top = req.top_logprobs
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise APIError(
            400,
            f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}",
            param="top_logprobs",
            code="invalid_value",
        )
    if top and not req.logprobs:
        raise APIError(
            400,
            "top_logprobs needs logprobs set to true",
            param="top_logprobs",
            code="invalid_value",
        )
    return (top or 0) if req.logprobs else None


def sampling_params(
    req,
    max_tokens: int,
    seed: int | None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """The request's sampling parameters, with OpenAI's defaults for the unset ones."""
    top_k = 0 if req.top_k in (None, -1) else req.top_k
    constraint = constraint_of(req.response_format)
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=top_k,
            max_tokens=max_tokens,
            seed=seed,
            sampler=req.sampler or "auto",
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=bool(req.ignore_eos),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            logit_bias=req.logit_bias,
            constraint=constraint,
        )
    except ValueError as exc:
        msg = str(exc)
        field = msg.removeprefix("invalid sampling parameter: ")
        param = next((p for p in _SAMPLING_FIELDS if field.startswith(p)), None)
        raise APIError(400, msg, param=param, code="invalid_value") from exc


def make_sequence(
    llm, prompt, params: SamplingParams, request_id: str, label: str, param: str
) -> Sequence:
    """``llm.make_request``, its errors about "prompt 0" renamed to ``label`` (the prompt's
    name in this request) and charged to the request field ``param``; a sampling parameter
    the vocabulary rules out (a logit_bias id) is charged to that parameter."""
    try:
        return llm.make_request(prompt, params, request_id)
    except ValueError as exc:
        field = str(exc).removeprefix("invalid sampling parameter: ")
        named = next((p for p in _SAMPLING_FIELDS if field.startswith(p)), None)
        if field != str(exc) and named is not None:
            raise APIError(400, str(exc), param=named, code="invalid_value") from exc
        if str(exc).startswith("invalid constraint"):  # a grammar this tokenizer cannot speak
            msg = str(exc).replace("invalid constraint", "invalid response_format", 1)
            raise APIError(400, msg, param="response_format", code="invalid_value") from exc
        msg = str(exc).replace("prompt 0 ", label, 1)
        code = "context_length_exceeded" if "context" in msg else "invalid_value"
        raise APIError(400, msg, param=param, code=code) from exc
