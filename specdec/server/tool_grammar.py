"""The grammar that makes an answer a tool call, for tool_choice "required" or a named function.

The answer must be one call (or, with parallel calls, several, one per line) in the model's
format, naming an offered function, with arguments valid under that function's JSON schema:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

It is written in llguidance's lark dialect, each function's parameters embedded as a ``%json``
schema, and is enforced by the grammar constraint (``specdec/constraints.py``) like any other
grammar: every decoding method stays exactly distributed as AR under it. The JSON is written
the way ``json.dumps`` writes it (", " and ": ", no other whitespace), as the chat templates
render earlier calls, so the model sees its usual shape and cannot stall on whitespace.
"""

from __future__ import annotations

import json

from specdec.server.tool_calls import ToolCallFormat

# json.dumps's layout; llguidance reads "x-guidance" from the schema itself
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def arguments_schema(function: dict) -> dict:
    """The schema a call's arguments must satisfy (no parameters: the empty object)."""
    schema = function.get("parameters")
    return dict(NO_PARAMETERS if schema is None else schema, **{"x-guidance": JSON_LAYOUT})


def _literal(text: str) -> str:
    return json.dumps(text)  # lark's string literals escape as JSON's do


def _tag(tag: str, special: bool) -> str:
    """A tag in lark: ``<tool_call>`` names a special token (Qwen's tags are single added
    tokens, which llguidance matches only as tokens), a quoted string is text."""
    return tag if special else _literal(tag)


def call_grammar(
    functions: list[dict], fmt: ToolCallFormat, parallel: bool, special_tags: bool
) -> str:
    """A lark grammar whose sentences are calls of ``functions`` (OpenAI function objects)."""
    if not functions:
        raise ValueError("a call grammar needs at least one function")
    calls = 'call ("\\n" call)*' if parallel else "call"
    names = " | ".join(f"fn_{i}" for i in range(len(functions)))
    open_, close = _tag(fmt.open, special_tags), _tag(fmt.close, special_tags)
    lines = [f"start: {calls}", f'call: {open_} "\\n" ({names}) "\\n" {close}']
    for i, fn in enumerate(functions):
        head = "{" + f"{json.dumps(fmt.name_key)}: {json.dumps(fn['name'])}, "
        head += f"{json.dumps(fmt.args_key)}: "
        schema = json.dumps(arguments_schema(fn), ensure_ascii=False)
        lines.append(f'fn_{i}: {_literal(head)} %json {schema} "}}"')
    return "\n".join(lines) + "\n"


def tags_are_special(tokenizer, fmt: ToolCallFormat) -> bool:
    """Whether the format's tags are single added tokens of ``tokenizer`` (a specdec
    Tokenizer), which the grammar must then name as tokens."""
    added = tokenizer.hf.get_added_vocab()
    return fmt.open in added and fmt.close in added


def call_constraint(tools, tokenizer, fmt: ToolCallFormat) -> dict:
    """The constraint (constraints.py) for a ``ToolRequest`` whose choice is enforced: any
    offered function ("required", several calls unless parallel_tool_calls is false) or the
    named one (one call). A function whose parameters the grammar engine cannot enforce is a
    400 naming it."""
    from specdec.constraints import check_constraint
    from specdec.server.errors import APIError

    for i, tool in enumerate(tools.tools):
        fn = tool["function"]
        if tools.function not in (None, fn["name"]):
            continue
        try:
            check_constraint({"type": "json_schema", "schema": arguments_schema(fn)})
        except ValueError as exc:
            where = f"tools[{i}].function.parameters"
            msg = str(exc).replace("invalid constraint: json_schema", f"{where} cannot be enforced")
            raise APIError(400, msg, param=where, code="invalid_value") from exc
    parallel = tools.parallel and tools.function is None
    special = tags_are_special(tokenizer, fmt)
    grammar = call_grammar(tools.functions(), fmt, parallel, special)
    return check_constraint({"type": "grammar", "grammar": grammar})
