"""From an OpenAI request to the engine's sequences, with the API's answer for each bad input
(an ``APIError`` that names the offending parameter)."""

from __future__ import annotations

from specdec.constraints import check_constraint
from specdec.sampling import SamplingParams
from specdec.sequence import Sequence
from specdec.server.errors import APIError

MAX_N = 128
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "sampler",
    "stop_token_ids",
    "stop",
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
        raise APIError(400, f"n must be in [1, {MAX_N}], got {n}", param="n")
    return n


def check_capacity(n: int, capacity: int) -> None:
    if n > capacity:
        raise APIError(
            400, f"{n} choices exceed the server's capacity of {capacity} requests", param="n"
        )


def completion_prompts(prompt) -> list:
    """A completion request's prompts: one text or token list, or a list of them."""
    # an empty token list is one prompt, so that make_sequence says "empty"
    single = isinstance(prompt, str) or not prompt or isinstance(prompt[0], int)
    return [prompt] if single else list(prompt)


def chat_prompt_ids(llm, messages: list[dict]) -> list[int]:
    """The messages under the model's chat template."""
    try:
        return llm.chat_prompt(messages)
    except Exception as exc:  # noqa: BLE001 - template errors are the input's fault
        raise APIError(400, f"could not apply the chat template: {exc}", param="messages") from exc


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


def sampling_params(req, max_tokens: int, seed: int | None) -> SamplingParams:
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
    name in this request) and charged to the request field ``param``."""
    try:
        return llm.make_request(prompt, params, request_id)
    except ValueError as exc:
        if str(exc).startswith("invalid constraint"):  # a grammar this tokenizer cannot speak
            msg = str(exc).replace("invalid constraint", "invalid response_format", 1)
            raise APIError(400, msg, param="response_format", code="invalid_value") from exc
        msg = str(exc).replace("prompt 0 ", label, 1)
        code = "context_length_exceeded" if "context" in msg else "invalid_value"
        raise APIError(400, msg, param=param, code=code) from exc
